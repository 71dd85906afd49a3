"""Percentile latency claims that hold at a stated confidence, by the
early-stopping rule of MLPerf Inference.

A claim "the p-th percentile of TTFT is at most B" is a claim that a request exceeds B with
probability at most 1 - p. Of n requests, k exceeded B. Were the true exceedance rate exactly
1 - p, k or fewer exceedances would happen with probability P(Binomial(n, 1 - p) <= k); when
that is at most 1 - confidence, the data reject "the rate is 1 - p or more" and the claim
holds at that confidence. Hence the query counts MLPerf publishes for p99 at 99%: 459 requests
with none over the bound, 662 with one (``tests/unit/test_early_stopping.py`` derives both).

A failed request counts as over the bound: it met no latency bound. Pure functions; the
report (``cellbench.report.percentile_claims``) and the plan (``cellbench.config.cost``)
show them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scipy import stats as sps

PERCENTILE = 0.99
CONFIDENCE = 0.99


def _check(percentile: float, confidence: float) -> None:
    if not (0 < percentile < 1 and 0 < confidence < 1):
        raise ValueError(
            f"percentile and confidence must lie strictly between 0 and 1, got "
            f"{percentile} and {confidence}"
        )


def bound_met(
    queries: int, over: int, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> bool:
    """Whether ``over`` of ``queries`` requests above the bound still shows the
    ``percentile``-th percentile within it at ``confidence``."""
    _check(percentile, confidence)
    if queries < 0 or not 0 <= over <= queries:
        raise ValueError(f"need 0 <= over <= queries, got over={over}, queries={queries}")
    if queries == 0:
        return False
    return float(sps.binom.cdf(over, queries, 1 - percentile)) <= 1 - confidence


def bound_exceeded(
    queries: int, over: int, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> bool:
    """Whether ``over`` of ``queries`` requests above the bound show, at ``confidence``, that
    the ``percentile``-th percentile lies above it: the mirror test, P(Binomial(queries,
    1 - percentile) >= over) <= 1 - confidence: the claim is refuted at that confidence."""
    _check(percentile, confidence)
    if queries < 0 or not 0 <= over <= queries:
        raise ValueError(f"need 0 <= over <= queries, got over={over}, queries={queries}")
    if over == 0:
        return False
    return float(sps.binom.sf(over - 1, queries, 1 - percentile)) <= 1 - confidence


MET, NOT_MET, CANNOT_TELL = "yes", "no", "cannot tell"


def verdict(
    queries: int, over: int, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> str:
    """``yes`` (the bound holds at ``confidence``), ``no`` (the percentile lies above it at
    ``confidence``) or ``cannot tell`` (too few queries either way, or none)."""
    if queries and bound_met(queries, over, percentile, confidence):
        return MET
    if queries and bound_exceeded(queries, over, percentile, confidence):
        return NOT_MET
    return CANNOT_TELL


def queries_needed(
    over: int = 0, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> int:
    """The fewest requests with which ``over`` exceedances still meet the claim."""
    _check(percentile, confidence)
    if over < 0:
        raise ValueError(f"over must be >= 0, got {over}")
    # the cdf falls as n grows: double, then bisect
    high = max(1, math.ceil((over + 1) / (1 - percentile)))
    while not bound_met(high, over, percentile, confidence):
        high *= 2
    low = over  # with n = over every request exceeded: never met
    while high - low > 1:
        mid = (low + high) // 2
        if bound_met(mid, over, percentile, confidence):
            high = mid
        else:
            low = mid
    return high


def max_over(
    queries: int, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> int | None:
    """The most exceedances ``queries`` requests may have with the claim still met; None when
    even none would not do (too few requests to support the claim at all)."""
    if not bound_met(queries, 0, percentile, confidence):
        return None
    k = 0
    while k + 1 <= queries and bound_met(queries, k + 1, percentile, confidence):
        k += 1
    return k


def claim(
    values_ms: Sequence[float],
    bound_ms: float,
    *,
    failed: int = 0,
    percentile: float = PERCENTILE,
    confidence: float = CONFIDENCE,
) -> dict:
    """One point's claim for one metric: ``queries`` (successful values + ``failed``),
    ``over`` (values above ``bound_ms``, plus the failed), ``met``, ``queries_needed`` (for the
    exceedances seen), ``max_over`` (what this many queries could afford) and ``observed_pct``
    (the share over the bound, %)."""
    if not bound_ms > 0:
        raise ValueError(f"bound_ms must be a positive number of milliseconds, got {bound_ms}")
    over = sum(1 for v in values_ms if v > bound_ms) + failed
    queries = len(values_ms) + failed
    return {
        "percentile": percentile,
        "confidence": confidence,
        "bound_ms": bound_ms,
        "queries": queries,
        "over": over,
        "observed_pct": 100 * over / queries if queries else math.nan,
        "met": bound_met(queries, over, percentile, confidence) if queries else False,
        "queries_needed": queries_needed(over, percentile, confidence),
        "max_over": max_over(queries, percentile, confidence) if queries else None,
    }


def request_latencies_ms(record: Mapping) -> dict[str, list[float]]:
    """Per successful request of one ``request_detail`` record: TTFT and TPOT in ms (TPOT =
    (E2EL - TTFT) / (output tokens - 1), as vLLM's benchmark defines it; requests of one
    output token have none), and the number of failed requests."""
    ttft, tpot = [], []
    failed = 0
    for t, lat, n, err in zip(
        record["ttfts"], record["latencies"], record["output_lens"], record["errors"], strict=True
    ):
        if err:
            failed += 1
            continue
        ttft.append(1000 * t)
        if n > 1:
            tpot.append(1000 * (lat - t) / (n - 1))
    return {"ttft_ms": ttft, "tpot_ms": tpot, "failed": failed}


def plan_warning(
    num_prompts: int, percentile: float = PERCENTILE, confidence: float = CONFIDENCE
) -> str | None:
    """The plan's warning when a point's prompt count cannot support a percentile claim even
    with no request over the bound; None when it can."""
    need = queries_needed(0, percentile, confidence)
    if num_prompts >= need:
        return None
    return (
        f"{num_prompts} prompts cannot support a p{100 * percentile:g} latency claim at "
        f"{100 * confidence:g}% confidence: even with none over the bound it needs {need} "
        f"(MLPerf's early-stopping rule); raise the point's prompt count or drop its bound"
    )
