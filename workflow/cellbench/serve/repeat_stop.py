"""Which grid points of a two-sided serve job still need interleaved pairs (issue 32 item 3).

With ``serve.repeat_cap`` set, the job measures every point ``serve.repeats`` times per side
(at least 2 interleaved pairs), then adds a pair only for the points whose verdict is still
open, until none is or the cap is reached. After each pair of a point, ``RepeatStop`` hands
its pairs so far to ``cellbench.stats.sequential.decide`` with the design the report will use
on the same pairs (``comparison.compare_serve``): rows = points x compared metrics, the cap,
the report's floor. A pair counts when both of its repeats are valid for every metric
(``comparison.invalid_reason``: the point's own ``invalid`` reason, a failed share above the
job's limit, a missing value); the others are counted as invalid, never silently dropped.

When the job is done, ``annotate`` writes into every point of every side what the report and
a reader need: ``repeat_cap``, ``repeats_used`` (pairs the point was measured in, valid or
not), ``stop_reason`` (``settled``, ``cap reached`` or ``too many invalid repeats``),
``invalid_repeats`` (the most invalid repeats either side had at that point) and
``stop_statuses`` (per metric: better, worse, equivalent within the floor, futile, cap
reached, as the rule settled it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cellbench.serve import load_shapes
from cellbench.stats import comparison, sequential

PointKey = tuple[int, int, str]
SETTLED = "settled"  # sequential.decide's reason when every metric is settled


def point_key(point: Mapping[str, Any]) -> PointKey:
    """A grid point's identity across repeats and sides: ISL, OSL and its load label."""
    return (int(point["isl"]), int(point["osl"]), load_shapes.point_label(point))


def valid_pairs(
    a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]], max_failed_share: float
) -> tuple[dict[str, tuple[list[float], list[float]]], int]:
    """One point's repeats of sides A and B paired by ``repeat``: per compared metric the
    values of the pairs whose both repeats are valid for every metric, in repeat order, and
    the most invalid repeats either side has (``comparison.invalid_reason``)."""
    by_a = {p["repeat"]: p for p in a}
    by_b = {p["repeat"]: p for p in b}

    def bad(p: Mapping[str, Any]) -> bool:
        return any(
            comparison.invalid_reason(p, m, max_failed_share) is not None
            for m in comparison.METRICS
        )

    invalid = max(sum(bad(p) for p in by_a.values()), sum(bad(p) for p in by_b.values()))
    keep = [r for r in sorted(by_a.keys() & by_b.keys()) if not bad(by_a[r]) and not bad(by_b[r])]
    pairs = {
        m: ([float(by_a[r][m]) for r in keep], [float(by_b[r][m]) for r in keep])
        for m in comparison.METRICS
    }
    return pairs, invalid


@dataclass
class RepeatStop:
    """The stopping state of one job: ``minimum`` pairs for every point, then pairs only
    while ``decide`` says continue, at most ``cap``."""

    points: list[PointKey]
    minimum: int
    cap: int
    floor_pct: float
    max_failed_share: float
    steps: dict[PointKey, dict[str, Any]] = field(default_factory=dict)
    used: dict[PointKey, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("repeat stopping needs at least one grid point")
        if self.minimum < 2 or self.cap < self.minimum:
            raise ValueError(
                f"repeat stopping needs 2 <= repeats <= repeat_cap, got repeats={self.minimum}, "
                f"repeat_cap={self.cap}"
            )
        # The report's design on the same pairs: one Holm family of points x metrics.
        self.design = sequential.Design(
            rows=len(self.points) * len(comparison.METRICS),
            cap=self.cap,
            floor_pct=self.floor_pct,
        )

    def wanted(self, rep: int) -> set[PointKey]:
        """The points to measure in repeat ``rep`` (0-based): all of them below the minimum,
        then those still open; empty once every point has stopped or at the cap."""
        if rep >= self.cap:
            return set()
        if rep < self.minimum:
            return set(self.points)
        return {k for k in self.points if self.steps.get(k, {}).get("action") != "stop"}

    def record(self, key: PointKey, a: list[dict], b: list[dict]) -> dict[str, Any]:
        """After a pair of ``key``: its sides' points so far; returns ``decide``'s answer."""
        self.used[key] = len({p["repeat"] for p in a} | {p["repeat"] for p in b})
        pairs, invalid = valid_pairs(a, b, self.max_failed_share)
        step = sequential.decide(pairs, comparison.METRICS, self.design, invalid=invalid)
        self.steps[key] = step
        return step

    def outcome(self, key: PointKey) -> dict[str, Any]:
        """What a point's records carry: its cap, pairs used, why it stopped, its invalid
        repeats and each metric's status."""
        step = self.steps[key]
        reason = step["reason"]
        if step["action"] != "stop":
            # Measured ``cap`` times, yet invalid pairs left fewer valid ones than the cap.
            reason = sequential.CAP
        open_ = {sequential.CONTINUE, sequential.CAP}
        if reason == sequential.CAP and not open_ & {s["status"] for s in step["metrics"].values()}:
            reason = SETTLED  # every metric settled, the last of them at the cap's look
        return {
            "repeat_cap": self.cap,
            "repeats_used": self.used[key],
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
        """One line for the job's log: pairs used per point and why each stopped."""
        parts = [
            f"{isl}-{osl} {label}: {self.used[k]} pairs, {self.outcome(k)['stop_reason']}"
            for k in self.points
            for isl, osl, label in [k]
        ]
        return "repeats stopped: " + "; ".join(parts)
