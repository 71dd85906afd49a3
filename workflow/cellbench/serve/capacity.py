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

What the probes mean (the bracket rule that gives a side's capacity, the two sides compared)
is ``cellbench.contracts.capacity``, which the plan, the loader and the report read too.

Every probe is recorded in the side's bench.json under ``capacity`` (bench.schema.json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from cellbench.contracts import load_shapes
from cellbench.contracts.capacity import (
    METRICS,
    Search,
    headline_side,
    point_bounds,
    probe_prompts,
)


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
