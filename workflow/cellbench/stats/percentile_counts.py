"""Which per-repeat latency percentiles may be published, and with how many requests behind
them.

A repeat's p99 over a handful of requests is its largest value, not a 99th percentile. A tail
percentile is published (serve.csv, tidy.csv) only where the requests behind it meet the count
of MLPerf Inference's early-stopping rule for that percentile at 99% confidence, even with
none over the bound (``early_stopping.queries_needed``): 459 for p99, 44 for p90. Below it the
value is left empty and the row says why. Every median and tail percentile carries its request
count (``REQUESTS``): successful requests for TTFT and E2EL, those of more than one token for
TPOT, those with at least one gap between chunks for ITL (the gaps of one request are not
independent queries, so they are not counted one by one).

bench.json keeps every figure the load generator computed (vLLM's keys); only what is
published is filtered. Files written before the counts were kept give TTFT and E2EL the
point's completed requests; TPOT and ITL, with no count recorded, publish no tail percentile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

from cellbench.stats import early_stopping as es

METRICS = ("ttft", "tpot", "itl", "e2el")
# tail percentile label -> its fraction
TAILS = {"p90": 0.90, "p99": 0.99}
CONFIDENCE = 0.99
NOTE = "percentile_note"


def requests_key(metric: str) -> str:
    """A point's key for the requests behind ``metric``'s statistics."""
    return f"{metric}_requests"


REQUESTS = tuple(requests_key(m) for m in METRICS)


@cache
def needed(label: str) -> int:
    """Requests a tail percentile needs to be published (MLPerf's count with none over)."""
    return es.queries_needed(0, TAILS[label], CONFIDENCE)


def request_count(point: Mapping[str, Any], metric: str) -> int | None:
    """The requests behind ``metric``'s statistics at a point (None: not recorded)."""
    count = point.get(requests_key(metric))
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    if metric in ("ttft", "e2el") and isinstance(point.get("completed"), int):
        return point["completed"]  # every successful request has one; older files
    return None


def published(point: Mapping[str, Any]) -> dict[str, Any]:
    """A point's published percentile fields: per metric its request count, and each tail
    percentile the point holds (``p99_ttft_ms``, ...) as measured or NaN when withheld, with
    ``percentile_note`` saying which were withheld and why ('' when none)."""
    out: dict[str, Any] = {requests_key(m): request_count(point, m) for m in METRICS}
    notes = []
    for metric in METRICS:
        for label in TAILS:
            key = f"{label}_{metric}_ms"
            if key not in point:
                continue
            why = withheld_reason(point, key)
            out[key] = math.nan if why else point[key]
            if why:
                notes.append(why)
    out[NOTE] = "; ".join(notes)
    return out


def withheld_reason(point: Mapping[str, Any], key: str) -> str | None:
    """Why one field of a point (``p99_tpot_ms``) is not published, or None when it is (or is
    not a tail percentile)."""
    label, _, rest = key.partition("_")
    metric = rest.removesuffix("_ms")
    if label not in TAILS or metric not in METRICS or not key.endswith("_ms"):
        return None
    count = request_count(point, metric)
    if count is None:
        return f"{label} {metric.upper()}: request count not recorded"
    if count < needed(label):
        return (
            f"{label} {metric.upper()}: {count} requests, fewer than the {needed(label)} "
            f"MLPerf's early-stopping rule needs at {100 * CONFIDENCE:g}% confidence"
        )
    return None


def count_of_field(point: Mapping[str, Any], key: str) -> int | None:
    """The requests behind one percentile field (``median_``, ``p90_``, ``p99_``), else None."""
    label, _, rest = key.partition("_")
    metric = rest.removesuffix("_ms")
    if label not in ("median", *TAILS) or metric not in METRICS:
        return None
    return request_count(point, metric)
