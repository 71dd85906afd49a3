"""Capacity at an SLA: per grid point and side, the largest concurrency at which the configured
latency bounds (``serve.sla``) hold at the configured percentile.

The search grows concurrency geometrically (x2) from ``start`` until every side has failed a
probe or ``max_concurrency`` is reached, then bisects between a side's last pass and its first
fail until the two are neighbours (the resolution of a concurrency search is one request), at
most ``max_probes`` probes in all. Each probe is one concurrency measured on every side in
turn (A then B, alternating which side goes first, as the grid does), with enough requests
for the percentile: MLPerf's early-stopping count for that percentile at ``confidence``
(``cellbench.stats.early_stopping.queries_needed``), and at least one request per slot. A probe
passes on a side when every bounded metric's measured percentile is at or under its bound and
no more than ``serve.max_failed_share`` of its requests failed.

A side's capacity is the largest passing concurrency below its smallest failing one (0 when the
smallest probed load already failed: no load met the SLA). One search per side gives one
boundary per side, with no repeat to measure its spread: ``compare`` calls a difference only
where the two sides' brackets [last pass, first fail) do not overlap, and otherwise says the
difference is below what the search could resolve.

Every probe is recorded in the side's bench.json under ``capacity`` (bench.schema.json).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from cellbench.serve import load_shapes
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


def percentile_values(detail: Mapping[str, list], percentile: float) -> dict[str, float | None]:
    """Each metric's percentile (ms) over a probe's successful requests (TPOT over those of
    more than one token); None where no request has the metric."""
    values: dict[str, list[float]] = {m: [] for m in METRICS}
    for ttft, lat, n, err in zip(
        detail["ttfts"], detail["latencies"], detail["output_lens"], detail["errors"], strict=True
    ):
        if err:
            continue
        values["ttft"].append(1000 * ttft)
        values["e2el"].append(1000 * lat)
        if n > 1:
            values["tpot"].append(1000 * (lat - ttft) / (n - 1))
    return {m: (float(np.percentile(v, percentile)) if v else None) for m, v in values.items()}


def decide(
    values: Mapping[str, float | None],
    bounds: Mapping[str, float],
    failed: int,
    sent: int,
    max_failed_share: float,
) -> list[str]:
    """What a probe broke: the bounded metrics over their bound (or with no value), and
    ``failed requests`` past the share; empty: it passed."""
    over = [m for m, b in bounds.items() if values.get(m) is None or values[m] > b]
    if sent and failed / sent > max_failed_share:
        over.append("failed requests")
    return over


def probe_record(
    concurrency: int,
    pt: Mapping[str, Any],
    detail: Mapping[str, list],
    bounds: Mapping[str, float],
    percentile: float,
    max_failed_share: float,
) -> dict[str, Any]:
    """One side's probe as bench.json keeps it."""
    values = percentile_values(detail, percentile)
    over = decide(values, bounds, pt["failed"], pt["num_prompts"], max_failed_share)
    good = load_shapes.goodput(
        detail["ttfts"],
        detail["latencies"],
        detail["output_lens"],
        detail["errors"],
        pt["duration"],
        bounds,
    )
    return {
        "concurrency": concurrency,
        "num_prompts": pt["num_prompts"],
        "completed": pt["completed"],
        "failed": pt["failed"],
        "duration": pt["duration"],
        "values_ms": values,
        "passed": not over,
        "over": over,
        "request_throughput": pt["request_throughput"],
        "output_throughput": pt["output_throughput"],
        "request_goodput": good["request_goodput"],
        "started_at": pt.get("started_at"),
    }


# measure(side, isl, osl, concurrency, prompts, step) -> (bench point, request detail)
Measure = Callable[[str, int, int, int, int, int], tuple[dict[str, Any], dict[str, list]]]


def search_point(
    sla: Mapping[str, Any],
    sides: Sequence[str],
    isl: int,
    osl: int,
    measure: Measure,
    max_failed_share: float,
) -> dict[str, dict[str, Any]]:
    """Run the search at one grid point; per side its entry (bounds, probes, outcome)."""
    bounds = point_bounds(sla, isl, osl)
    search = Search(sides, int(sla["start"]), int(sla["max_concurrency"]), int(sla["max_probes"]))
    probes: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    step = 0
    while (conc := search.next()) is not None:
        order = list(sides) if step % 2 == 0 else list(reversed(sides))
        prompts = probe_prompts(sla, conc)
        passed = {}
        for side in order:
            pt, detail = measure(side, isl, osl, conc, prompts, step)
            rec = probe_record(conc, pt, detail, bounds, sla["percentile"], max_failed_share)
            rec["step"] = step
            probes[side].append(rec)
            passed[side] = rec["passed"]
        search.record(conc, passed)
        step += 1
    return {
        side: {
            "isl": isl,
            "osl": osl,
            "bounds_ms": dict(bounds),
            "probes": probes[side],
            **search.outcome(side),
        }
        for side in sides
    }


def run_search(
    sla: Mapping[str, Any],
    sides: Sequence[str],
    grid: Sequence[Mapping[str, int]],
    measure: Measure,
    max_failed_share: float,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, dict[str, Any]]:
    """The search at every bounded grid point; per side its bench.json ``capacity`` section."""
    out = {
        side: {
            "percentile": sla["percentile"],
            "confidence": sla["confidence"],
            "start": sla["start"],
            "max_concurrency": sla["max_concurrency"],
            "max_probes": sla["max_probes"],
            "points": [],
        }
        for side in sides
    }
    for gp in grid:
        if not point_bounds(sla, gp["isl"], gp["osl"]):
            continue
        entries = search_point(sla, sides, gp["isl"], gp["osl"], measure, max_failed_share)
        for side, entry in entries.items():
            out[side]["points"].append(entry)
            log(f"capacity {gp['isl']}-{gp['osl']} {side}: {headline_side(entry, sla)}")
    return out


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


def on_servers(
    cfg: Any, runs: Mapping[str, Any], check_alive: Callable[..., None], log: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """The search on a serve job's live servers (``runs``: side name -> its run, as the serve
    stage's measurement holds them), after the grid; per side its ``capacity`` section.
    ``check_alive`` is the stage's: a server that dies during a probe fails the job."""
    from cellbench.serve import loadgen, observed_point

    observe = observed_point.Observation(
        metrics_interval_s=cfg.metrics_interval_s,
        telemetry_interval_s=cfg.telemetry_interval_s,
        gpu_vendor=cfg.gpu_vendor,
    )

    def measure(side: str, isl: int, osl: int, conc: int, prompts: int, step: int):
        run = runs[side]
        spec = loadgen.PointSpec(
            isl=isl,
            osl=osl,
            max_concurrency=conc,
            num_prompts=prompts,
            num_warmups=0,  # the servers are warm from the grid
            # the same prompts on every side at a step, others than the grid's
            seed=cfg.seed + 10_000 + step,
        )
        started = datetime.now(UTC).isoformat(timespec="milliseconds")
        pt, detail = observed_point.run(
            run.server.base_url,
            run.server.model_id,
            run.tok,
            spec,
            load_shape=load_shapes.CONCURRENCY,
            ignore_eos=run.ignore_eos,
            backend="vllm" if cfg.runtime == "docker" else "openai",
            gpu_indices=run.gpu_indices,
            observe=observe,
        )
        pt["started_at"] = started
        check_alive(
            runs,
            f"during the capacity probe {isl}-{osl} c{conc} on the {side} server",
            suspect=side if pt["failed"] else None,
        )
        return pt, detail

    sla = cfg.sla
    log(f"capacity search: p{sla['percentile']:g}, c{sla['start']} up to c{sla['max_concurrency']}")
    return run_search(cfg.sla, list(runs), cfg.grid, measure, cfg.max_failed_share, log)
