"""Percentile claims by MLPerf's early-stopping rule (cellbench.stats.early_stopping, issue 32
item 5). The counts MLPerf publishes for p99 at 99% confidence (459 queries with none over the
bound, 662 with one) are derived here from the binomial definition with plain math, then the
module must give the same."""

from __future__ import annotations

import math

import pytest
from cellbench.stats import early_stopping as es


def _cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _first_n(k: int) -> int:
    n = k + 1
    while _cdf(k, n, 0.01) > 0.01:
        n += 1
    return n


def test_mlperfs_published_counts():
    assert _first_n(0) == 459 and _first_n(1) == 662  # the definition gives MLPerf's figures
    assert es.queries_needed(0) == 459 and es.queries_needed(1) == 662
    assert es.queries_needed(2) == _first_n(2)
    assert not es.bound_met(458, 0) and es.bound_met(459, 0)
    assert not es.bound_met(661, 1) and es.bound_met(662, 1)
    assert es.max_over(458) is None and es.max_over(459) == 0 and es.max_over(662) == 1


def test_a_claim_from_request_latencies():
    # 700 requests, 1 slower than the bound, 1 failed: 2 over, which 700 cannot afford
    values = [50.0] * 698 + [250.0]
    c = es.claim(values, 200.0, failed=1)
    assert (c["queries"], c["over"], c["met"]) == (700, 2, False)
    assert c["queries_needed"] == _first_n(2) and c["max_over"] == 1
    assert es.claim(values, 300.0, failed=0)["met"] is True  # 699 queries, none over
    with pytest.raises(ValueError, match="bound_ms"):
        es.claim(values, 0)


def test_request_latencies_from_a_detail_record():
    record = {
        "ttfts": [0.1, 0.2, 0.0],
        "latencies": [1.1, 0.2, 0.0],
        "output_lens": [11, 1, 0],
        "errors": ["", "", "timeout"],
    }
    got = es.request_latencies_ms(record)
    assert got["ttft_ms"] == pytest.approx([100.0, 200.0])
    assert got["tpot_ms"] == pytest.approx([100.0])  # (1.1 - 0.1) s / 10 tokens
    assert got["failed"] == 1


def test_the_plan_warns_when_a_point_cannot_support_its_claim():
    text = es.plan_warning(160)
    assert text.startswith("160 prompts cannot support a p99 latency claim at 99% confidence")
    assert "459" in text
    assert es.plan_warning(459) is None
    assert "needs 45" in es.plan_warning(10, percentile=0.95, confidence=0.9)


def test_a_percentile_shown_above_the_bound_is_told_from_too_few_queries():
    # the mirror test: P(Binomial(n, 0.01) >= k) <= 0.01 shows the p99 above the bound
    def tail(k: int, n: int) -> float:
        return 1 - _cdf(k - 1, n, 0.01)

    assert tail(2, 8) <= 0.01 < tail(1, 8)  # of 8 queries, 2 over show it; 1 does not
    assert es.bound_exceeded(8, 2) and not es.bound_exceeded(8, 1)
    assert not es.bound_exceeded(1000, 0)
    assert [es.verdict(8, k) for k in (0, 1, 2)] == ["cannot tell", "cannot tell", "no"]
    assert es.verdict(459, 0) == "yes" and es.verdict(0, 0) == "cannot tell"
    # 700 queries: 1 over still meets it, 5 over neither meets nor fails it, many over fail
    assert es.verdict(700, 1) == "yes"
    assert tail(5, 700) > 0.01 and es.verdict(700, 5) == "cannot tell"
    assert tail(15, 700) <= 0.01 and es.verdict(700, 15) == "no"
    with pytest.raises(ValueError, match="over <= queries"):
        es.bound_exceeded(3, 4)
