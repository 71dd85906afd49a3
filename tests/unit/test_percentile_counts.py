"""Which percentiles are published (cellbench.stats.percentile_counts): the counts come from
the definition (n requests with none over the bound show the percentile p at confidence c
when p**n <= 1 - c), not from the module."""

from __future__ import annotations

import math

from cellbench.stats import percentile_counts as pc


def _fewest(p: float, confidence: float = 0.99) -> int:
    n = 1
    while p**n > 1 - confidence:
        n += 1
    return n


def test_counts_are_mlperfs():
    assert pc.needed("p99") == _fewest(0.99) == 459
    assert pc.needed("p90") == _fewest(0.90) == 44


def _point(**counts) -> dict:
    point = {"completed": 50, "failed": 0}
    for metric in pc.METRICS:
        point.update({f"median_{metric}_ms": 1.0, f"p90_{metric}_ms": 2.0, f"p99_{metric}_ms": 3.0})
    point.update({f"{m}_requests": n for m, n in counts.items()})
    return point


def test_published_withholds_what_its_count_cannot_carry():
    point = _point(ttft=50, tpot=43, itl=500, e2el=50)
    out = pc.published(point)
    assert out["p90_ttft_ms"] == 2.0 and math.isnan(out["p99_ttft_ms"])
    assert math.isnan(out["p90_tpot_ms"]) and math.isnan(out["p99_tpot_ms"])
    assert out["p90_itl_ms"] == 2.0 and out["p99_itl_ms"] == 3.0
    assert out["tpot_requests"] == 43 and out["itl_requests"] == 500
    note = out[pc.NOTE]
    assert "p99 TTFT: 50 requests, fewer than the 459" in note
    assert "p90 TPOT: 43 requests, fewer than the 44" in note
    assert "ITL" not in note
    # Nothing withheld: an empty note.
    assert pc.published(_point(ttft=459, tpot=459, itl=459, e2el=459))[pc.NOTE] == ""


def test_older_points_without_counts():
    # TTFT and E2EL: every completed request has one; TPOT and ITL: count unknown.
    point = {k: v for k, v in _point().items() if not k.endswith("_requests")}
    point["completed"] = 500
    out = pc.published(point)
    assert out["ttft_requests"] == 500 and out["p99_ttft_ms"] == 3.0
    assert out["tpot_requests"] is None and math.isnan(out["p90_tpot_ms"])
    assert "p90 TPOT: request count not recorded" in out[pc.NOTE]
    # A point without p90 (written before it was kept) gets none invented.
    del point["p90_ttft_ms"]
    assert "p90_ttft_ms" not in pc.published(point)


def test_field_helpers():
    point = _point(ttft=10, tpot=500, itl=500, e2el=10)
    assert pc.count_of_field(point, "median_tpot_ms") == 500
    assert pc.count_of_field(point, "mean_tpot_ms") is None
    assert pc.count_of_field(point, "output_throughput") is None
    assert pc.withheld_reason(point, "p99_tpot_ms") is None
    assert pc.withheld_reason(point, "median_ttft_ms") is None
    assert pc.withheld_reason(point, "p90_e2el_ms").startswith("p90 E2EL: 10 requests")
