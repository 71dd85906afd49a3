"""Which grid points of a two-sided serve job still need server starts.

A two-sided job runs in rounds: each round starts a fresh server per side and measures the
points still open ``serve.repeats`` times, interleaved. With ``serve.starts`` = {min, cap},
every point gets ``min`` rounds; after each round from then on, ``RepeatStop`` hands each
point's valid repeats, grouped by start and paired by (start, repeat), to
``cellbench.stats.sequential.decide`` with the design the report replays on the same starts
(``comparison.compare_serve``): rows = points x compared metrics, the cap, the margin
(``report.min_change_pct``). A pair counts when both of its repeats are valid for every
metric (``comparison.invalid_reason``); the others are counted as invalid, never silently
dropped.

When the job is done, ``annotate`` writes into every point of every side what the report and
a reader need: ``starts_min``, ``starts_cap``, ``starts_used`` (rounds the point was measured
in), ``stop_reason`` (``settled``, ``cap reached`` or ``too many invalid repeats``),
``invalid_repeats`` (the most invalid repeats either side had at that point) and
``stop_statuses`` (per metric: changed, equivalent, futile, cap reached, continue).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cellbench.contracts.point import PointKey, point_key
from cellbench.stats import comparison, sequential

SETTLED = sequential.SETTLED


def valid_groups(
    a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]], max_failed_share: float
) -> tuple[dict[str, tuple[list[list[float]], list[list[float]]]], int]:
    """One point's repeats of sides A and B paired by (start, repeat): per compared metric the
    values per start of the pairs whose both repeats are valid for every metric, and the most
    invalid repeats either side has (``comparison.invalid_reason``)."""

    def key(p: Mapping[str, Any]) -> tuple[int, int]:
        return int(p.get("start") or 0), int(p["repeat"])

    by_a = {key(p): p for p in a}
    by_b = {key(p): p for p in b}

    def bad(p: Mapping[str, Any]) -> bool:
        return any(
            comparison.invalid_reason(p, m, max_failed_share) is not None
            for m in comparison.METRICS
        )

    invalid = max(sum(bad(p) for p in by_a.values()), sum(bad(p) for p in by_b.values()))
    keep = [k for k in sorted(by_a.keys() & by_b.keys()) if not bad(by_a[k]) and not bad(by_b[k])]
    starts = sorted({s for s, _ in keep})
    groups = {
        m: (
            [[float(by_a[k][m]) for k in keep if k[0] == s] for s in starts],
            [[float(by_b[k][m]) for k in keep if k[0] == s] for s in starts],
        )
        for m in comparison.METRICS
    }
    return groups, invalid


@dataclass
class RepeatStop:
    """The stopping state of one job: ``minimum`` rounds for every point, then rounds only
    while ``decide`` says continue, at most ``cap``."""

    points: list[PointKey]
    minimum: int
    cap: int
    margin_pct: float
    max_failed_share: float
    steps: dict[PointKey, dict[str, Any]] = field(default_factory=dict)
    used: dict[PointKey, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("start stopping needs at least one grid point")
        if self.minimum < 2 or self.cap < self.minimum:
            raise ValueError(
                f"start stopping needs 2 <= starts min <= starts cap, got min={self.minimum}, "
                f"cap={self.cap}"
            )
        # The report's design on the same starts: one Bonferroni family of points x metrics.
        self.design = sequential.Design(
            rows=len(self.points) * len(comparison.METRICS),
            cap=self.cap,
            min_starts=self.minimum,
            margin_pct=self.margin_pct,
        )

    def wanted(self, round_: int) -> set[PointKey]:
        """The points to measure in round ``round_`` (0-based): all of them below the
        minimum, then those still open; empty once every point has stopped or at the cap."""
        if round_ >= self.cap:
            return set()
        if round_ < self.minimum:
            return set(self.points)
        return {k for k in self.points if self.steps.get(k, {}).get("action") != "stop"}

    def record(self, key: PointKey, a: list[dict], b: list[dict]) -> dict[str, Any]:
        """After a round of ``key``: its sides' points so far; returns ``decide``'s answer."""
        self.used[key] = len({p.get("start") or 0 for p in a} | {p.get("start") or 0 for p in b})
        groups, invalid = valid_groups(a, b, self.max_failed_share)
        step = sequential.decide(groups, comparison.METRICS, self.design, invalid=invalid)
        self.steps[key] = step
        return step

    def outcome(self, key: PointKey) -> dict[str, Any]:
        """What a point's records carry: the design's min and cap, starts used, why it
        stopped, its invalid repeats and each metric's status."""
        step = self.steps[key]
        # Measured ``cap`` times, yet invalid pairs left fewer valid starts than the cap.
        reason = step["reason"] if step["action"] == "stop" else sequential.CAP
        return {
            "starts_min": self.minimum,
            "starts_cap": self.cap,
            "starts_used": self.used[key],
            "stop_reason": reason,
            "invalid_repeats": step["invalid"],
            "stop_statuses": {m: s["status"] for m, s in step["metrics"].items()},
        }

    def annotate(self, sides: Iterable[list[dict[str, Any]]]) -> None:
        """Write ``outcome`` into every point of every side."""
        for points in sides:
            for p in points:
                p.update(self.outcome(point_key(p)))

    def summary(self) -> str:
        """One line for the job's log: starts used per point and why each stopped."""
        parts = [
            f"{isl}-{osl} {label}: {self.used[k]} starts, {self.outcome(k)['stop_reason']}"
            for k in self.points
            for isl, osl, label in [k]
        ]
        return "starts stopped: " + "; ".join(parts)
