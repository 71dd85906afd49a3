"""The checks that mark a measured repeat invalid (cellbench.contracts.validity), on per-request
lists written out by hand: each case's expected reason follows from its numbers."""

from __future__ import annotations

import pytest
from cellbench.contracts import validity
from cellbench.report import frames
from cellbench.stats import comparison
from support import result_fixtures as fx


def _detail(requests: list[tuple[int, list[float], float, float, str]]) -> dict[str, list]:
    """(output tokens, ITL gaps s, TTFT s, E2EL s, error) per request, as request_detail
    keeps them."""
    return {
        "output_lens": [r[0] for r in requests],
        "itls": [r[1] for r in requests],
        "ttfts": [r[2] for r in requests],
        "latencies": [r[3] for r in requests],
        "errors": [r[4] for r in requests],
    }


def _point(completed: int, failed: int) -> dict:
    return {"completed": completed, "failed": failed, "errors": ["HTTP 500"] * failed}


# 4 tokens, first at 10 ms, then one every 5 ms: TPOT 5 ms, ITL 5 ms.
STREAMED = (4, [0.005, 0.005, 0.005], 0.010, 0.025, "")


def test_a_normal_stream_is_valid():
    detail = _detail([STREAMED, STREAMED])
    assert validity.invalid_reason(_point(2, 0), detail, max_failed_share=0.0) is None


def test_failed_share_past_the_limit():
    detail = _detail([STREAMED, STREAMED, (0, [], 0.0, 0.0, "HTTP 500")])
    point = _point(2, 1)
    why = validity.invalid_reason(point, detail, max_failed_share=0.2)
    assert why.startswith("1 of 3 requests failed (33.3% > serve.max_failed_share 20.0%)")
    assert "HTTP 500" in why
    assert validity.invalid_reason(point, detail, max_failed_share=0.34) is None


def test_one_chunk_of_several_tokens():
    burst = (4, [], 0.010, 0.010, "")
    why = validity.invalid_reason(_point(2, 0), _detail([STREAMED, burst]), max_failed_share=0.0)
    assert why.startswith("1 of 2 requests sent all their tokens (4 at most) in one chunk")
    # A one-token answer has no gaps by nature: valid.
    single = (1, [], 0.010, 0.010, "")
    assert validity.one_chunk_reason(_detail([single, STREAMED])) is None


def test_tpot_floor_uses_the_median_over_requests():
    # 4 tokens 0.01 ms apart after the first: TPOT 0.01 ms in two requests of three.
    fast = (4, [0.00001] * 3, 0.010, 0.01003, "")
    detail = _detail([fast, fast, STREAMED])
    why = validity.floor_reason(detail, 0.1, None)
    assert why.startswith("median TPOT 0.01 ms below the plausible floor 0.1 ms")
    assert validity.floor_reason(_detail([fast, STREAMED, STREAMED]), 0.1, None) is None
    assert validity.floor_reason(detail, None, None) is None


def test_itl_floor_uses_the_mean_gap():
    # Bursty flushes: 2 near-zero gaps and one of 9 ms, mean 3 ms: a real stream.
    bursty = (4, [0.000001, 0.000001, 0.009], 0.010, 0.019, "")
    assert validity.floor_reason(_detail([bursty]), None, 0.1) is None
    fast = (4, [0.00002] * 3, 0.010, 0.01006, "")
    why = validity.floor_reason(_detail([fast]), None, 0.1)
    assert why.startswith("mean ITL 0.02 ms below the plausible floor 0.1 ms")


def _pt(repeat: int, invalid: str | None = None) -> dict:
    p = {"isl": 8, "osl": 4, "max_concurrency": 1, "repeat": repeat}
    return p if invalid is None else {**p, "invalid": invalid}


def _key(p: dict) -> tuple:
    return (p["isl"], p["osl"], f"c{p['max_concurrency']}")


def test_enough_valid_repeats():
    ok = [_pt(0), _pt(1, "burst"), _pt(2)]
    validity.check_enough({"untuned": ok, "tuned": [_pt(0), _pt(1), _pt(2)]}, _key)
    # One repeat configured: that one must be valid; two or more: two must be.
    validity.check_enough({"untuned": [_pt(0)]}, _key)
    with pytest.raises(validity.TooFewValidRepeats, match=r"tuned 8-4 c1: 1 valid of 3 repeats"):
        validity.check_enough({"untuned": ok, "tuned": [_pt(0, "x"), _pt(1), _pt(2, "y")]}, _key)
    with pytest.raises(validity.TooFewValidRepeats, match=r"0 valid of 1 repeats \(needs 1\); x"):
        validity.check_enough({"untuned": [_pt(0, "x")]}, _key)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "0.1"])
def test_a_floor_must_be_a_positive_finite_number(bad):
    with pytest.raises(ValueError, match="--min-plausible-tpot-ms = .*a finite number of ms > 0"):
        validity.finite_floor(bad, "--min-plausible-tpot-ms")
    assert validity.finite_floor(None, "x") is None and validity.finite_floor(2, "x") == 2.0


def test_older_points_are_judged_from_their_summary():
    # 16 tokens per request, TPOT 0.007 ms: the burst an older vLLM image sent.
    old = {"completed": 2, "total_output_tokens": 32, "median_tpot_ms": 0.007, "mean_itl_ms": 0.007}
    why = validity.summary_reason(old)
    assert why.startswith("median TPOT 0.007 ms below the plausible floor 0.1 ms")
    assert why.endswith(validity.REPORT_TIME)
    # Every request one chunk: no gap, a mean ITL of 0.
    assert "mean ITL 0 ms" in validity.summary_reason(
        {**old, "median_tpot_ms": 5.0, "mean_itl_ms": 0}
    )
    # One token per request: nothing to judge (vLLM's 0 for an empty list is no burst).
    assert validity.summary_reason({**old, "total_output_tokens": 2}) is None
    # A point the serve stage judged (its counts are there) or marked keeps its own word.
    assert validity.summary_reason({**old, "ttft_requests": 2}) is None
    assert validity.summary_reason({**old, "invalid": "x"}) is None


def test_the_report_leaves_an_older_burst_repeat_out_of_the_verdict(tmp_path):
    res = tmp_path / "results"
    cell = "rocm7.2/m/tp1-ep1"
    for arm in ("untuned", "tuned"):
        points = [
            fx.point(64, 16, repeat=r, seq=2 * r + (arm == "tuned"), concurrency=2, prompts=4)
            for r in range(3)
        ]
        if arm == "tuned":  # repeat 1 of the tuned arm arrived in a burst
            points[1] |= {"median_tpot_ms": 0.007, "mean_tpot_ms": 0.007, "mean_itl_ms": 0.007}
        fx.write_bench(res, cell, arm, points)
    files = sorted(res.rglob("bench.json"))
    serve, _, _ = frames.cell_frames(frames.load_inputs(files, res))
    marked = serve[serve["invalid"].notna()]
    assert list(zip(marked.arm, marked.repeat, strict=True)) == [("tuned", 1)]
    rows = comparison.compare_serve(serve[serve.arm == "untuned"], serve[serve.arm == "tuned"])
    tpot = next(r for r in rows if r["metric"] == "mean_tpot_ms")
    assert (tpot["invalid_a"], tpot["invalid_b"]) == (0, 1)
    assert any(validity.REPORT_TIME in why for why in tpot["invalid_reasons"])
