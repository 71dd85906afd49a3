"""What a capacity result means (``serve.sla``): the bounds at a grid point, the requests a
probe needs, the bracket rule that turns a side's probes into its capacity, the two sides'
capacities compared, and the words for them. The search that runs the probes is the serve
stage's (``cellbench.serve.capacity``); the config check, the plan, the results loader and the
report read these.

A side's capacity is the largest passing concurrency below its smallest failing one (0 when the
smallest probed load already failed: no load met the SLA). One search per side gives one
boundary per side, with no repeat to measure its spread: ``compare`` calls a difference only
where the two sides' brackets [last pass, first fail) do not overlap, and otherwise says the
difference is below what the search could resolve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellbench.stats import early_stopping, starts

METRICS = ("ttft", "tpot", "e2el")
BOUND_KEYS = tuple(f"{m}_ms" for m in METRICS)
FOUND = "found"  # last pass and first fail are neighbours
NONE_MET = "no load met"  # the smallest probed load failed
ALL_MET = "met up to max_concurrency"  # no probed load failed, max_concurrency passed
OPEN = "probe cap reached"  # the cap ended the search before its bracket closed


def point_bounds(sla: Mapping[str, Any], isl: int, osl: int) -> dict[str, float]:
    """The bounds (metric -> ms) at one grid point: the section's, replaced per metric by a
    ``points`` entry naming the point (null there: that metric unbounded at the point)."""
    bounds = {m: sla[f"{m}_ms"] for m in METRICS if sla.get(f"{m}_ms") is not None}
    for entry in sla.get("points", []):
        if (entry["isl"], entry["osl"]) == (isl, osl):
            for m in METRICS:
                if f"{m}_ms" in entry:
                    bounds.pop(m, None)
                    if entry[f"{m}_ms"] is not None:
                        bounds[m] = entry[f"{m}_ms"]
    return bounds


def probe_prompts(sla: Mapping[str, Any], concurrency: int) -> int:
    """Requests of one probe: MLPerf's count for the percentile at the confidence (none over
    the bound), and at least one per slot so the load is reached."""
    need = early_stopping.queries_needed(0, sla["percentile"] / 100, sla["confidence"] / 100)
    return max(need, concurrency)


def max_probe_steps(sla: Mapping[str, Any], sides: int = 2) -> int:
    """The most probes the search can take per grid point (each on every side): the doublings
    from ``start`` to ``max_concurrency``, then per side a bisection of the widest bracket
    they can leave, never more than ``max_probes``."""
    start, top = int(sla["start"]), int(sla["max_concurrency"])
    grow, c = 1, start
    while c < top:
        c = min(2 * c, top)
        grow += 1
    widest = max(start, (top + 1) // 2)  # the last doubling's bracket (or 0..start)
    bisect = math.ceil(math.log2(widest)) if widest > 1 else 0
    return min(int(sla["max_probes"]), grow + sides * bisect)


@dataclass
class Search:
    """The search's state over the sides: which concurrency to probe next, and each side's
    bracket from its probes so far (pure: the caller measures)."""

    sides: Sequence[str]
    start: int
    max_concurrency: int
    max_probes: int
    results: dict[str, dict[int, bool]] = field(default_factory=dict)  # side -> c -> passed
    probed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results = {s: {} for s in self.sides}

    def record(self, concurrency: int, passed: Mapping[str, bool]) -> None:
        """One probe's outcome on every side."""
        self.probed.append(concurrency)
        for side in self.sides:
            self.results[side][concurrency] = bool(passed[side])

    def bracket(self, side: str) -> tuple[int, int | None]:
        """(last pass below the first fail, first fail); 0 and None where none."""
        res = self.results[side]
        fails = [c for c, ok in res.items() if not ok]
        first_fail = min(fails) if fails else None
        passes = [c for c, ok in res.items() if ok and (first_fail is None or c < first_fail)]
        return (max(passes) if passes else 0), first_fail

    def next(self) -> int | None:
        """The next concurrency to probe, or None when the search is over."""
        if len(self.probed) >= self.max_probes:
            return None
        if not self.probed:
            return min(self.start, self.max_concurrency)
        last = max(self.probed)
        growing = any(self.bracket(s)[1] is None for s in self.sides)
        if growing and last < self.max_concurrency:
            return min(2 * last, self.max_concurrency)
        gaps = []
        for side in self.sides:
            lo, hi = self.bracket(side)
            if hi is not None and hi - lo > 1:
                gaps.append((hi - lo, -self.sides.index(side), (lo + hi) // 2))
        if not gaps:
            return None
        mid = max(gaps)[2]
        return mid if mid not in self.probed else None

    def outcome(self, side: str) -> dict[str, Any]:
        """A side's capacity, first failing load and how the search ended for it."""
        lo, hi = self.bracket(side)
        res = self.results[side]
        if hi is None:
            status = ALL_MET if res.get(self.max_concurrency) else OPEN
        elif lo == 0 and hi == min(self.probed):
            status = NONE_MET
        else:
            status = FOUND if hi - lo <= 1 else OPEN
        # a pass above a fail: the percentile is noisy at this load, the bracket stays the
        # conservative one (the first fail) and the record says so
        above = any(ok and hi is not None and c > hi for c, ok in res.items())
        return {"capacity": lo, "first_fail": hi, "status": status, "non_monotone": above}


def sla_text(bounds: Mapping[str, float], percentile: float) -> str:
    """``p90 TPOT <= 50 ms and p90 TTFT <= 900 ms``."""
    return " and ".join(
        f"p{percentile:g} {m.upper()} <= {bounds[m]:g} ms" for m in METRICS if m in bounds
    )


def requests(n: int) -> str:
    """``1 concurrent request``, ``24 concurrent requests``."""
    return f"{n} concurrent request{'' if n == 1 else 's'}"


def headline_side(entry: Mapping[str, Any], sla: Mapping[str, Any]) -> str:
    """One side's result in words (no load met, a capacity, or met at every load)."""
    text = sla_text(entry["bounds_ms"], sla["percentile"])
    if entry["status"] == NONE_MET:
        smallest = min(entry["probes"], key=lambda p: p["concurrency"])
        seen = ", ".join(
            f"{m.upper()} {smallest['values_ms'][m]:.1f} ms"
            for m in entry["bounds_ms"]
            if smallest["values_ms"].get(m) is not None
        )
        return (
            f"no load met {text}; the smallest probed load {smallest['concurrency']} gave "
            f"{seen or 'no value'}"
        )
    cap = f"sustains {requests(entry['capacity'])} at {text}"
    if entry["status"] == ALL_MET:
        return cap + " (every probed load met it: at least this many)"
    if entry["status"] == OPEN:
        hi = entry["first_fail"]
        return cap + (f" (between {entry['capacity']} and {hi}: probe cap)" if hi else "")
    return cap


def resolution_pct(entry: Mapping[str, Any]) -> float:
    """The smallest change in capacity the search could have seen on this side: the width of
    its bracket over its capacity, in % (inf where it has no upper end or no capacity)."""
    lo, hi = entry["capacity"], entry["first_fail"]
    if hi is None or lo <= 0:
        return math.inf
    return 100.0 * (hi - lo) / lo


def compare(
    untuned: Mapping[str, Any], tuned: Mapping[str, Any], margin_pct: float
) -> dict[str, Any]:
    """The two sides' capacities at one point compared: change % (tuned over untuned), the
    verdict (better/worse/equivalent/inconclusive, as the pipeline names them) and the
    smallest change the search could have seen. One boundary per side, no repeat: a
    difference is called only where the brackets [capacity, first fail) do not overlap."""
    a_lo, a_hi = untuned["capacity"], untuned["first_fail"]
    b_lo, b_hi = tuned["capacity"], tuned["first_fail"]
    change = 100.0 * (b_lo / a_lo - 1) if a_lo > 0 else math.inf if b_lo > 0 else math.nan
    see = max(resolution_pct(untuned), resolution_pct(tuned))
    if a_lo == 0 and b_lo == 0:
        verdict, why = "n/a", "no load met the SLA on either arm"
    elif a_hi is not None and b_lo >= a_hi:
        verdict, why = starts.BETTER, "the brackets do not overlap"
    elif b_hi is not None and a_lo >= b_hi:
        verdict, why = starts.WORSE, "the brackets do not overlap"
    elif (a_lo, a_hi) == (b_lo, b_hi) and see <= margin_pct:
        verdict, why = starts.EQUIVALENT, f"same boundary, resolved within {margin_pct:g}%"
    else:
        verdict = starts.INCONCLUSIVE
        why = "the difference is below the search's resolution"
    return {"change_pct": change, "verdict": verdict, "could_see_pct": see, "why": why}


def verdict_text(row: Mapping[str, Any]) -> str:
    """The verdict as a reader needs it: inconclusive says what the search could have seen."""
    if row["verdict"] != starts.INCONCLUSIVE:
        return row["verdict"]
    see = row["could_see_pct"]
    if math.isinf(see):
        return "inconclusive (a bracket has no upper end: raise max_concurrency)"
    return f"inconclusive (could have seen changes of at least {see:.1f}%)"


def consistency_problem(section: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """What a recorded ``capacity`` section gets wrong about its own probes, as (field, value,
    what was expected), or None: a probe passed with a value over its bound, or a point's
    capacity and first fail are not what its probes give. A schema cannot say this; the
    results loader asks."""
    for i, entry in enumerate(section["points"]):
        bounds = entry["bounds_ms"]
        results = {}
        for j, probe in enumerate(entry["probes"]):
            over = [m for m, b in bounds.items()
                    if probe["values_ms"].get(m) is None or probe["values_ms"][m] > b]  # fmt: skip
            if over and probe["passed"]:
                where = f"points[{i}].probes[{j}].passed"
                return where, True, f"false: {', '.join(over)} over its bound"
            results[probe["concurrency"]] = probe["passed"]
        search = Search(["side"], 1, 1, 0)
        search.results = {"side": results}
        lo, hi = search.bracket("side")
        if (entry["capacity"], entry["first_fail"]) != (lo, hi):
            return (
                f"points[{i}].capacity",
                entry["capacity"],
                f"{lo} with first fail {hi}, as its probes give",
            )
    return None
