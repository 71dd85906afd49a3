"""Whether one measured repeat of a grid point can count, and whether a job still has enough
valid repeats to answer.

A repeat is invalid, recorded with its reason in the point's ``invalid`` field (read back by
``cellbench.stats.comparison.invalid_reason``), when:

* more of its requests failed than ``serve.max_failed_share`` allows;
* a request of more than one output token arrived as one streamed chunk: the server did not
  stream it, so its TPOT and ITL say nothing about decoding;
* its median TPOT, or its mean ITL, lies below a physical floor (``serve.min_plausible_tpot_ms``,
  ``serve.min_plausible_itl_ms``): no decoder produces tokens that fast, so the tokens were
  buffered and sent in a burst (a vLLM server once did this intermittently, at 0.007 ms).

The mean ITL is taken, not the median: a server that flushes a few tokens per socket write
gives many near-zero gaps inside a burst, while their mean still spans the whole stream.

An invalid repeat does not stop the job: it is logged, kept in bench.json and counted beside
the verdict. The job fails (``TooFewValidRepeats``) only when a point is left with fewer valid
repeats on a side than the test needs (two, or every repeat measured when fewer were).
A server that dies is fatal before any of this (``measure._check_alive``).

Points written before these checks existed carry no ``invalid`` and no request counts: the
report judges them from their summaries with the default floors (``summary_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Floors no real decoder goes under: a decode step of the smallest model on the fastest GPU
# takes well over 0.1 ms, while a buffered burst parses its tokens microseconds apart.
DEFAULT_MIN_TPOT_MS = 0.1
DEFAULT_MIN_ITL_MS = 0.1
# Valid repeats a side needs at a point for the comparison to have a spread to test.
MIN_VALID = 2


class TooFewValidRepeats(RuntimeError):
    """A point has too few valid repeats on a side for its verdict."""


def failed_reason(point: Mapping[str, Any], max_failed_share: float) -> str | None:
    """The reason when a point's failed share of requests is above ``max_failed_share``."""
    total = point["completed"] + point["failed"]
    share = point["failed"] / total if total else 1.0
    if share <= max_failed_share:
        return None
    errors = "; ".join(point.get("errors", [])[:2])
    return (
        f"{point['failed']} of {total} requests failed ({share:.1%} > serve.max_failed_share "
        f"{max_failed_share:.1%})" + (f"; first errors: {errors}" if errors else "")
    )


def one_chunk_reason(detail: Mapping[str, Sequence]) -> str | None:
    """The reason when a successful request of more than one output token came as one chunk
    (no gap between chunks to measure)."""
    rows = zip(detail["output_lens"], detail["itls"], detail["errors"], strict=True)
    burst = [n for n, gaps, err in rows if not err and n > 1 and not gaps]
    if not burst:
        return None
    ok = sum(1 for err in detail["errors"] if not err)
    return (
        f"{len(burst)} of {ok} requests sent all their tokens ({max(burst)} at most) in one "
        "chunk: the stream was not streamed token by token"
    )


def request_tpots_ms(detail: Mapping[str, Sequence]) -> list[float]:
    """Per successful request of more than one token: (E2EL - TTFT) / (tokens - 1), in ms."""
    rows = zip(
        detail["ttfts"], detail["latencies"], detail["output_lens"], detail["errors"], strict=True
    )
    return [1000.0 * (lat - ttft) / (n - 1) for ttft, lat, n, err in rows if not err and n > 1]


def floor_reason(
    detail: Mapping[str, Sequence], min_tpot_ms: float | None, min_itl_ms: float | None
) -> str | None:
    """The reason when the median TPOT or the mean ITL is below its floor (None: no floor)."""
    tpots = request_tpots_ms(detail)
    if min_tpot_ms is not None and tpots:
        median = _median(tpots)
        if median < min_tpot_ms:
            return (
                f"median TPOT {median:.4g} ms below the plausible floor {min_tpot_ms:g} ms "
                "(serve.min_plausible_tpot_ms): tokens were sent in a burst"
            )
    gaps = [g for request in detail["itls"] for g in request]
    if min_itl_ms is not None and gaps:
        mean = 1000.0 * sum(gaps) / len(gaps)
        if mean < min_itl_ms:
            return (
                f"mean ITL {mean:.4g} ms below the plausible floor {min_itl_ms:g} ms "
                "(serve.min_plausible_itl_ms): tokens were sent in a burst"
            )
    return None


REPORT_TIME = "checked at report time: written before the serve stage checked its streams"


def summary_reason(
    point: Mapping[str, Any],
    min_tpot_ms: float = DEFAULT_MIN_TPOT_MS,
    min_itl_ms: float = DEFAULT_MIN_ITL_MS,
) -> str | None:
    """For a point written before the serve stage judged its streams (it has no
    ``ttft_requests`` and no ``invalid``): the same floors read from its summary, with the
    default floors. A point some request of which produced more than one token, whose median
    TPOT or mean ITL lies under the floor (a mean ITL of 0: no gap at all, every request in
    one chunk), is implausible. None for a newer point: its own record says."""
    if "ttft_requests" in point or point.get("invalid"):
        return None
    completed, tokens = point.get("completed") or 0, point.get("total_output_tokens") or 0
    if not completed or tokens <= completed:  # no request of several tokens: no TPOT to judge
        return None
    for key, name, floor, setting in (
        ("median_tpot_ms", "median TPOT", min_tpot_ms, "serve.min_plausible_tpot_ms"),
        ("mean_itl_ms", "mean ITL", min_itl_ms, "serve.min_plausible_itl_ms"),
    ):
        value = point.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < floor:
            return (
                f"{name} {value:.4g} ms below the plausible floor {floor:g} ms ({setting}'s "
                f"default): tokens were sent in a burst; {REPORT_TIME}"
            )
    return None


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def invalid_reason(
    point: Mapping[str, Any],
    detail: Mapping[str, Sequence],
    *,
    max_failed_share: float,
    min_tpot_ms: float | None = DEFAULT_MIN_TPOT_MS,
    min_itl_ms: float | None = DEFAULT_MIN_ITL_MS,
) -> str | None:
    """Why one measured repeat cannot count (the first reason found), or None when it can.
    ``detail``: its per-request lists (``request_detail.detail_of``)."""
    return (
        failed_reason(point, max_failed_share)
        or one_chunk_reason(detail)
        or floor_reason(detail, min_tpot_ms, min_itl_ms)
    )


def short_points(points_by_side: Mapping[str, Iterable[Mapping[str, Any]]], key: Any) -> list[str]:
    """The points of any side left with fewer valid repeats than the test needs: a line each
    naming the side, the point, its valid repeats of those measured and the reasons.
    ``key``: a point's grid key (e.g. ``repeat_stop.point_key``)."""
    out = []
    for side, points in points_by_side.items():
        groups: dict[Any, list[Mapping[str, Any]]] = {}
        for p in points:
            groups.setdefault(key(p), []).append(p)
        for k, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
            reasons = [p["invalid"] for p in group if p.get("invalid")]
            valid = len(group) - len(reasons)
            if valid < min(MIN_VALID, len(group)):
                where = f"{k[0]}-{k[1]} {k[2]}" if isinstance(k, tuple) and len(k) == 3 else k
                out.append(
                    f"{side} {where}: {valid} valid of {len(group)} repeats "
                    f"(needs {min(MIN_VALID, len(group))}); " + "; ".join(sorted(set(reasons)))
                )
    return out


def check_enough(points_by_side: Mapping[str, Iterable[Mapping[str, Any]]], key: Any) -> None:
    """Raise ``TooFewValidRepeats`` naming every point without enough valid repeats."""
    short = short_points(points_by_side, key)
    if short:
        raise TooFewValidRepeats(
            "too few valid repeats to answer (each side needs "
            f"{MIN_VALID} valid repeats per point): " + " | ".join(short)
        )


def finite_floor(value: Any, name: str) -> float | None:
    """A floor setting: None (no floor) or a finite number > 0; else ValueError naming it."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} = {value!r}: a finite number of ms > 0, or null for no floor")
    return float(value)
