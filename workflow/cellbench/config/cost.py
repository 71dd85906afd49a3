"""The cost of a config's run, stated before it starts (`cellbench plan`).

Per cell and job kind (tune, serve, gsm8k): seconds of wall clock, the GPUs the job holds,
and GPU-hours. Each figure says what it rests on:

- **history**: the same cell's last jobs in this results folder (Snakemake's benchmark files,
  ``results/benchmarks/<cell>/*.tsv``) and their result files. The serve job splits into a
  fixed part (server start, warm-ups, GSM8K, the rest: the last job's wall less its measured
  points) and the points (each measured point's duration, times the repeats and arms planned
  now), so a change of repeats or grid scales only what it changes. The tune job scales with
  batch sizes x configs per batch size.
- **archive**: no history of that job kind in this results folder (a fresh checkout, results
  cleaned after archiving): the newest archived run (``results/archive/<label>/<run>/``)
  holding the same cell (image name, model, tp, ep) whose files match its manifest and which
  kept the cell's benchmark files; the same arithmetic on its copies. The basis names the run,
  says when its image digest differs from the one pinned now, and names each newer run passed
  over for failing its check.
- **assumed**: no history; the ``plan`` section of the config (every value there is an
  assumption the user can set, and is printed as one).

Where ``report.latency_bounds`` is set, the estimate also warns per point whose prompts over
all repeats cannot support the percentile claim even with none over the bound
(``config.latency_bounds.plan_warnings``; MLPerf's 459 queries for p99 at 99%).

Where ``serve.sla`` is set, the serve job's figure includes its capacity search: an upper
bound on its probes per searched point (the doublings, the bisections and the probe cap:
``contracts.capacity.max_probe_steps``), each on both arms, priced at the longest probe of the
point in the last run (history) or at the plan's assumed wave times the probe's waves.

Beside the cost of the config as it stands, ``detect`` says what a run can see: per point the
server starts and repeats per start needed for ``report.target_detectable_pct`` and their
GPU-hours (``cellbench.config.detect_plan``), naming each point that cannot reach it within
the caps (its own ``warnings``).

The workflow's start writes the estimate (``results/plan/{run_label}/estimate.json``); the
report sets it against the jobs' measured walls.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.config import detect_plan, latency_bounds, loader
from cellbench.config.jobargs import gpus_per_server
from cellbench.results import archived, job_times
from cellbench.results import loaders as results_loaders
from cellbench.runtime import images, pins

ARMS = loader.ARMS


def _tune_work(batch_sizes: list, max_configs: int | None) -> int:
    """What a tune job's wall scales with: batch sizes x configs per batch size (1 when the
    search is not capped: then only the batch sizes are known to scale it)."""
    return len(batch_sizes) * max(int(max_configs or 0), 1)


def _points(config: dict) -> list[tuple[int, int, int]]:
    serve = config["serve"]
    return [(g["isl"], g["osl"], c) for g in serve["grid"] for c in serve["concurrency"]]


def _history_points(results: Path, cell: str) -> tuple[dict, float, list[float]] | str:
    """Mean measured duration per (isl, osl, concurrency), the sum of every measured point's
    duration and each server start's ready time (both arms), from the cell's last serve
    results; else why there are none."""
    durations: dict[tuple[int, int, int], list[float]] = {}
    total = 0.0
    ready: list[float] = []
    for arm in ARMS:
        path = results / cell / "serve" / arm / "bench.json"
        if not path.is_file():
            return f"no {arm} bench.json"
        try:
            bench = results_loaders.load_bench(path, results).data
        except results_loaders.ResultError as exc:  # a result the report would refuse
            return f"the last {arm} bench.json was refused ({exc})"
        for p in bench["points"]:
            d = float(p.get("duration") or 0.0)
            durations.setdefault((p["isl"], p["osl"], p["max_concurrency"]), []).append(d)
            total += d
        server = bench.get("server") or {}
        ready += [float(s) for s in server.get("starts_ready_s") or [server.get("ready_s") or 0]]
    means = {k: sum(v) / len(v) for k, v in durations.items()}
    return means, total, ready


def _probe_times(results: Path, cell: str) -> dict[tuple[int, int], list[float]]:
    """Each searched point's probe durations (both arms) in the cell's last serve results."""
    times: dict[tuple[int, int], list[float]] = {}
    for arm in ARMS:
        path = results / cell / "serve" / arm / "bench.json"
        try:
            bench = results_loaders.load_bench(path, results).data
        except (OSError, results_loaders.ResultError):
            return {}
        for entry in (bench.get("capacity") or {}).get("points", []):
            durations = [float(p["duration"]) for p in entry["probes"]]
            times.setdefault((entry["isl"], entry["osl"]), []).extend(durations)
    return times


def _add_search(config: dict, est: dict[str, Any], history: Path | None, cell: str) -> None:
    """Add serve.sla's capacity search to the serve job's estimate: its probe count's upper
    bound per searched point x both arms x a probe's time. A history's figure already holds
    the last search in its fixed part: that is taken out and priced anew."""
    sla = config["serve"].get("sla")
    if not sla:
        return
    from cellbench.contracts import capacity

    steps = capacity.max_probe_steps(sla, len(ARMS))
    before = _probe_times(history, cell) if history is not None else {}
    est["seconds"] = max(est["seconds"] - sum(sum(v) for v in before.values()), 0.0)
    start = int(sla["start"])
    waves = math.ceil(capacity.probe_prompts(sla, start) / start)
    points = [(g["isl"], g["osl"]) for g in config["serve"]["grid"]]
    points = [pt for pt in points if capacity.point_bounds(sla, *pt)]
    priced = []
    for isl, osl in points:
        if before.get((isl, osl)):
            probe_s, how = max(before[(isl, osl)]), "the last run's longest probe"
        else:
            probe_s, how = waves * _assumed_point_s(config, isl, osl), f"{waves} assumed waves"
        est["seconds"] += steps * len(ARMS) * probe_s
        priced.append(f"{isl}-{osl}: {probe_s:.1f} s ({how})")
    last = sum(sum(v) for v in before.values())
    est["basis"] += (
        f"; capacity search (serve.sla): up to {steps} probes x {len(ARMS)} arms per point, "
        + ", ".join(priced)
        + (f" (the last run's search, {last:.0f} s, taken out of the fixed part)" if last else "")
    )


def _previous_tune_work(results: Path, cell: str) -> int | None:
    """The last tune job's work, from its summary.json read by the checked loader (None when
    there is none the report would accept)."""
    path = results / cell / "tune" / "summary.json"
    if not path.is_file():
        return None
    try:
        summary = results_loaders.load_tune(path, results).data
    except results_loaders.ResultError:
        return None
    return _tune_work(summary["batch_sizes"], summary.get("max_configs"))


@dataclass(frozen=True)
class _Source:
    """Where a cell's history is read: the results folder, or an archived run's folder (which
    holds the cell's results and benchmark files at the same places)."""

    root: Path
    basis: str  # how a figure from here starts: "history" or "archive: LABEL/RUN"
    times: dict[str, job_times.JobTime]
    note: str = ""  # said after the figure (an archived run's other digest)


@dataclass
class _Archive:
    """The archived run a cell's estimate may fall back on, looked up once and only when the
    results folder lacks some history: the run (None when none fits) and the newer runs
    passed over, each with its reason."""

    source: _Source | None = None
    skipped: list[str] = field(default_factory=list)

    def skipped_text(self) -> str:
        if not self.skipped:
            return ""
        shown = self.skipped[:3] + (
            [f"{len(self.skipped) - 3} more"] if len(self.skipped) > 3 else []
        )
        return "; skipped " + "; ".join(shown)


def _check_problem(run: archived.Run) -> str | None:
    """Why an archived run cannot be trusted (its files against its manifest), or None."""
    check = archived.check_run(run.path)
    if check.ok():
        return None
    if check.manifest_unreadable:
        return f"{archived.MANIFEST_NAME} missing or unreadable"
    named = [
        f"{kind} {name}"
        for kind, names in (
            ("changed", check.changed),
            ("missing", check.missing),
            ("extra", check.extra),
        )
        for name in names
    ]
    more = f" and {len(named) - 2} more" if len(named) > 2 else ""
    return "fails its check (" + ", ".join(named[:2]) + more + ")"


def _pinned_digest(config: dict, image: str) -> str:
    """The digest the image is pinned to now (as the rules see it), or why it is unknown."""
    try:
        return pins.Pins.for_config(config).digest(image)
    except images.ImageError as exc:
        return f"unknown ({exc})"


def find_archived(
    config: dict, cell: loader.Cell, archive_root: Path, checked: dict | None = None
) -> _Archive:
    """The newest archived run holding ``cell`` that kept its benchmark files and passes its
    check (every file against its manifest); the newer runs holding the cell that fail their
    check are named with the reason. Runs that kept no benchmark files (archived before they
    were kept) are passed over without hashing them. ``checked`` keeps each run's check for
    the next cell (one estimate hashes a run once)."""
    checked = {} if checked is None else checked
    found = _Archive()
    for run in reversed(archived.runs(archive_root)):
        manifest = archived.read_manifest(run.path)
        listed = manifest is not None and cell.cell_id in manifest.get("cells", [])
        if not listed and not (run.path / cell.cell_id).is_dir():
            continue
        if not job_times.benchmark_files(run.path, cell.cell_id):
            continue
        if run.path not in checked:
            checked[run.path] = _check_problem(run)
        problem = checked[run.path]
        if problem is None:
            try:
                times = job_times.cell_job_times(run.path, cell.cell_id)
            except job_times.JobTimeError as exc:
                problem = str(exc)
        if problem is not None:
            found.skipped.append(f"archive: {run.ref}: {problem}")
            continue
        then = (manifest.get("images") or {}).get(cell.image)
        now = _pinned_digest(config, cell.image)
        note = "" if then == now else f"; image digest then {then}, pinned now {now}"
        found.source = _Source(run.path, f"archive: {run.ref}", times, note)
        return found
    return found


def _assumed_point_s(config: dict, isl: int, osl: int) -> float:
    """One wave of requests at one point, by the plan's assumed TTFT and TPOT."""
    plan = config["plan"]
    return (plan["ttft_ms_per_1k_input"] * isl / 1000 + plan["tpot_ms"] * osl) / 1000


def estimate_cell(
    config: dict,
    cell: loader.Cell,
    results: Path,
    archive_root: Path | None = None,
    checked: dict | None = None,
) -> dict[str, dict[str, Any]]:
    """Per job kind: seconds, gpus, gpu_hours, basis (history, archive or assumed, with its
    source). A kind without history in ``results`` falls back on the cell's newest trusted
    archived run under ``archive_root`` (default ``results/archive``)."""
    serve, plan = config["serve"], config["plan"]
    gpus = gpus_per_server(config, cell)
    pair = bool(serve["interleave_arms"])
    # Each round of server starts measures the grid serve.repeats times; sequential starts stop
    # between serve.starts.min and the cap: the estimate takes the cap, the most a point can
    # cost, and says so. One-arm jobs run the minimum.
    starts_cfg = serve["starts"]
    rounds = int(starts_cfg["cap"] if pair else starts_cfg["min"])
    arms, repeats = len(ARMS), int(serve["repeats"]) * rounds
    upto = "up to " if pair and int(starts_cfg["cap"]) > int(starts_cfg["min"]) else ""
    waves = int(serve["prompts_per_concurrency"]) + int(serve.get("warmups_per_concurrency") or 0)
    here = _Source(results, "history", job_times.cell_job_times(results, cell.cell_id))
    root = Path(archive_root) if archive_root is not None else results / "archive"
    lookup: list[_Archive] = []  # the archive, once asked

    def sources() -> Iterator[_Source]:
        yield here
        if not lookup:
            lookup.append(find_archived(config, cell, root, checked))
        if lookup[0].source is not None:
            yield lookup[0].source

    def skipped() -> str:
        return lookup[0].skipped_text() if lookup else ""

    out: dict[str, dict[str, Any]] = {}
    used: dict[str, _Source] = {}

    # tune
    work = _tune_work(loader.batch_sizes(config), config["tune"].get("max_configs"))
    for src in sources():
        prev_work = _previous_tune_work(src.root, cell.cell_id) if "tune" in src.times else None
        if prev_work:
            used["tune"] = src
            seconds = src.times["tune"].seconds * work / prev_work
            files = ", ".join(src.times["tune"].files)
            basis = (
                f"{src.basis}: {files} x {work}/{prev_work} (batch sizes x max_configs)"
                f"{src.note}{skipped()}"
            )
            break
    else:
        n = len(loader.batch_sizes(config))
        seconds = n * plan["tune_s_per_batch_size"]
        per = plan["tune_s_per_batch_size"]
        basis = f"assumed: {n} batch sizes x plan.tune_s_per_batch_size {per} s{skipped()}"
    out["tune"] = {"seconds": seconds, "gpus": gpus, "basis": basis}

    # serve (both arms' servers, the grid's repeats, GSM8K against each arm)
    points = _points(config)
    why: list[str] = []  # why each place gave no serve history
    for src in sources():
        if "serve" not in src.times:
            why.append("no serve job ran" if src is here else f"{src.basis}: no serve job")
            continue
        measured = _history_points(src.root, cell.cell_id)
        if isinstance(measured, str):
            why.append(measured if src is here else f"{src.basis}: {measured}")
            continue
        used["serve"] = src
        means, measured_total, ready = measured
        fixed = max(src.times["serve"].seconds - measured_total, 0.0)
        # The fixed part holds the last job's server starts: price the rounds planned now at
        # their measured mean instead.
        start_s = sum(ready) / len(ready) if ready else plan["server_start_s"]
        fixed = max(fixed - sum(ready), 0.0) + arms * rounds * start_s
        per_repeat = 0.0
        for isl, osl, c in points:
            per_repeat += means.get((isl, osl, c), waves * _assumed_point_s(config, isl, osl))
        # The fixed part holds the last job's GSM8K: another question count changes it.
        gsm8k_s, gsm8k_note = detect_plan.gsm8k_change(config, src.root, cell.cell_id)
        seconds = max(fixed + gsm8k_s, 0.0) + arms * repeats * per_repeat
        basis = (
            f"{src.basis}: {', '.join(src.times['serve'].files)} ({fixed:.0f} s fixed, "
            f"{arms} arms x {upto}{rounds} server starts at {start_s:.0f} s) + "
            f"{arms} arms x {upto}{repeats} repeats x the measured points{gsm8k_note}"
            f"{src.note}{skipped()}"
        )
        break
    else:
        starts = arms * rounds
        per_repeat = sum(waves * _assumed_point_s(config, isl, osl) for isl, osl, _ in points)
        # gsm8k.limit null is the whole set: its real size, every instance, both arms
        questions, counted = detect_plan.gsm8k_questions(config)
        runs = arms * questions * int(config["gsm8k"]["instances"])
        gsm8k_s = runs * plan["gsm8k_s_per_question"]
        seconds = starts * plan["server_start_s"] + arms * repeats * per_repeat + gsm8k_s
        basis = (
            "assumed: plan.server_start_s, plan.ttft_ms_per_1k_input, plan.tpot_ms, "
            f"plan.gsm8k_s_per_question x {questions} GSM8K questions ({counted}) x "
            f"{config['gsm8k']['instances']} instances x {arms} arms, "
            f"{arms} arms x {upto}{rounds} server starts, {upto}{repeats} repeats "
            f"(no history: {'; '.join(why)}{skipped()})"
        )
    out["serve"] = {"seconds": seconds, "gpus": gpus * (arms if pair else 1), "basis": basis}
    serve_src = used.get("serve")
    _add_search(config, out["serve"], serve_src.root if serve_src else None, cell.cell_id)

    # gsm8k (the per-arm summary jobs; lm-eval itself runs inside the serve job)
    src = next((s for s in sources() if "gsm8k" in s.times), None)
    if src is not None:
        used["gsm8k"] = src
        files = ", ".join(src.times["gsm8k"].files)
        out["gsm8k"] = {
            "seconds": src.times["gsm8k"].seconds,
            "gpus": 0,
            "basis": f"{src.basis}: {files}{src.note}{skipped()}",
        }
    else:
        out["gsm8k"] = {
            "seconds": arms * plan["summary_job_s"],
            "gpus": 0,
            "basis": f"assumed: {arms} x plan.summary_job_s {plan['summary_job_s']} s{skipped()}",
        }
    for job in out.values():
        job["gpu_hours"] = job["seconds"] * job["gpus"] / 3600
    # The history job's mtime lets the report tell a job that did not rerun (this results
    # folder's own files only: an archived copy is never the job's file now).
    for kind, src in used.items():
        if src is here:
            out[kind]["history_mtime"] = here.times[kind].mtime
    return out


def estimate(
    config: dict, results: Path | str = "results", archive_root: Path | str | None = None
) -> dict[str, Any]:
    """Every cell's estimate; history from ``results``, else from the archive (default
    ``results/archive``)."""
    results = Path(results)
    root = Path(archive_root) if archive_root is not None else results / "archive"
    checked: dict = {}  # each archived run's check, done once for all cells
    cells = {
        c.cell_id: estimate_cell(config, c, results, root, checked) for c in loader.cells(config)
    }
    totals = {
        kind: {
            "seconds": sum(c[kind]["seconds"] for c in cells.values()),
            "gpu_hours": sum(c[kind]["gpu_hours"] for c in cells.values()),
        }
        for kind in job_times.KIND_FILES
    }
    detect = detect_plan.plan(config, results, root)
    return {
        "kind": job_times.ESTIMATE_KIND,
        "run_label": config["run_label"],
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "cells": cells,
        "totals": totals,
        "assumptions": dict(config["plan"]),
        # What a run can see; its warnings name the points that cannot see the target.
        "detect": detect,
        # Points whose prompts cannot support report.latency_bounds' claim (issue 32 item 5).
        "warnings": latency_bounds.plan_warnings(config),
    }


def write(est: dict[str, Any], results: Path | str = "results") -> Path:
    """Write ``est`` where the report of its config's run label reads it."""
    path = Path(results) / job_times.estimate_file(est["run_label"])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomicio.write_json(path, est)
    return path


def _hms(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def render(est: dict[str, Any]) -> str:
    """The estimate as a terminal table: one row per cell and job kind, then the totals."""
    lines = [f"{'cell':<44} {'job':<6} {'wall':>9} {'GPUs':>4} {'GPU-h':>8}  basis"]
    for cell, jobs in est["cells"].items():
        for kind, job in jobs.items():
            lines.append(
                f"{cell:<44} {kind:<6} {_hms(job['seconds']):>9} {job['gpus']:>4} "
                f"{job['gpu_hours']:>8.2f}  {job['basis']}"
            )
    wall = sum(t["seconds"] for t in est["totals"].values())
    gpu_h = sum(t["gpu_hours"] for t in est["totals"].values())
    lines.append(
        f"total: {_hms(wall)} of jobs one after another, {gpu_h:.2f} GPU-hours "
        f"({len(est['cells'])} cells; jobs side by side shorten the wall, not the GPU-hours)"
    )
    lines += [f"warning: {w}" for w in est.get("warnings", [])]
    if "detect" in est:
        lines += detect_plan.render(est["detect"])
        lines += [f"warning: {w}" for w in est["detect"]["warnings"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cellbench plan",
        description="Estimate the wall time and GPU-hours of a config's jobs before running them "
        "(from each cell's last jobs in the results folder, else from its newest archived run, "
        "else the config's plan assumptions).",
    )
    parser.add_argument("--configfile", default="config/local.yaml")
    parser.add_argument("--results", default="results", help="results folder (default: results)")
    parser.add_argument(
        "--archive-root",
        help="archive read for cells without history in the results folder "
        "(default: RESULTS/archive)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="also write the estimate to RESULTS/plan/RUN_LABEL/estimate.json for the report",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    args = parser.parse_args(argv)
    try:
        config = loader.load(args.configfile)
        est = estimate(config, args.results, args.archive_root)
    except (loader.ConfigError, job_times.JobTimeError) as exc:
        print(f"cellbench plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(est, indent=2) if args.json else render(est))
    if args.write:
        print(f"estimate written to {write(est, args.results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
