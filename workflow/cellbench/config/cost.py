"""The cost of a config's run, stated before it starts (`cellbench plan`).

Per cell and job kind (tune, serve, gsm8k): seconds of wall clock, the GPUs the job holds,
and GPU-hours. Each figure says what it rests on:

- **history**: the same cell's last jobs in this results folder (Snakemake's benchmark files,
  ``results/benchmarks/<cell>/*.tsv``) and their result files. The serve job splits into a
  fixed part (server start, warm-ups, GSM8K, the rest: the last job's wall less its measured
  points) and the points (each measured point's duration, times the repeats and arms planned
  now), so a change of repeats or grid scales only what it changes. The tune job scales with
  batch sizes x configs per batch size.
- **assumed**: no history; the ``plan`` section of the config (every value there is an
  assumption the user can set, and is printed as one).

Where ``report.latency_bounds`` is set, the estimate also warns per point whose prompts over
all repeats cannot support the percentile claim even with none over the bound
(``config.latency_bounds.plan_warnings``; MLPerf's 459 queries for p99 at 99%).

The workflow's start writes the estimate (``results/plan/estimate.json``); the report sets it
against the jobs' measured walls.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.config import latency_bounds, loader
from cellbench.config.jobargs import gpus_per_server
from cellbench.results import job_times
from cellbench.results import loaders as results_loaders

ARMS = loader.ARMS


def _tune_work(batch_sizes: list, max_configs: int | None) -> int:
    """What a tune job's wall scales with: batch sizes x configs per batch size (1 when the
    search is not capped: then only the batch sizes are known to scale it)."""
    return len(batch_sizes) * max(int(max_configs or 0), 1)


def _points(config: dict) -> list[tuple[int, int, int]]:
    serve = config["serve"]
    return [(g["isl"], g["osl"], c) for g in serve["grid"] for c in serve["concurrency"]]


def _history_points(results: Path, cell: str) -> tuple[dict, float] | str:
    """Mean measured duration per (isl, osl, concurrency) and the sum of every measured
    point's duration, from the cell's last serve results; else why there are none."""
    durations: dict[tuple[int, int, int], list[float]] = {}
    total = 0.0
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
    means = {k: sum(v) / len(v) for k, v in durations.items()}
    return means, total


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


def _assumed_point_s(config: dict, isl: int, osl: int) -> float:
    """One wave of requests at one point, by the plan's assumed TTFT and TPOT."""
    plan = config["plan"]
    return (plan["ttft_ms_per_1k_input"] * isl / 1000 + plan["tpot_ms"] * osl) / 1000


def estimate_cell(config: dict, cell: loader.Cell, results: Path) -> dict[str, dict[str, Any]]:
    """Per job kind: seconds, gpus, gpu_hours, basis (history or assumed, with its source)."""
    serve, plan = config["serve"], config["plan"]
    gpus = gpus_per_server(config, cell)
    pair = bool(serve["interleave_arms"])
    # sequential repeats stop between serve.repeats and the cap: the estimate takes the cap,
    # the most a point can cost, and says so
    arms, repeats = len(ARMS), int(serve.get("repeat_cap") or serve["repeats"])
    upto = "up to " if serve.get("repeat_cap") else ""
    waves = int(serve["prompts_per_concurrency"]) + int(serve.get("warmups_per_concurrency") or 0)
    history = job_times.cell_job_times(results, cell.cell_id)
    out: dict[str, dict[str, Any]] = {}

    # tune
    work = _tune_work(loader.batch_sizes(config), config["tune"].get("max_configs"))
    prev_work = _previous_tune_work(results, cell.cell_id)
    if "tune" in history and prev_work:
        seconds = history["tune"].seconds * work / prev_work
        files = ", ".join(history["tune"].files)
        basis = f"history: {files} x {work}/{prev_work} (batch sizes x max_configs)"
    else:
        n = len(loader.batch_sizes(config))
        seconds = n * plan["tune_s_per_batch_size"]
        per = plan["tune_s_per_batch_size"]
        basis = f"assumed: {n} batch sizes x plan.tune_s_per_batch_size {per} s"
    out["tune"] = {"seconds": seconds, "gpus": gpus, "basis": basis}

    # serve (both arms' servers, the grid's repeats, GSM8K against each arm)
    points = _points(config)
    measured = _history_points(results, cell.cell_id) if "serve" in history else "no serve job ran"
    if not isinstance(measured, str):
        means, measured_total = measured
        fixed = max(history["serve"].seconds - measured_total, 0.0)
        per_repeat = 0.0
        for isl, osl, c in points:
            per_repeat += means.get((isl, osl, c), waves * _assumed_point_s(config, isl, osl))
        seconds = fixed + arms * repeats * per_repeat
        basis = (
            f"history: {', '.join(history['serve'].files)} ({fixed:.0f} s fixed) + "
            f"{arms} arms x {upto}{repeats} repeats x the measured points"
        )
    else:
        starts = 1 if pair else arms
        per_repeat = sum(waves * _assumed_point_s(config, isl, osl) for isl, osl, _ in points)
        gsm8k_s = arms * int(config["gsm8k"].get("limit") or 0) * plan["gsm8k_s_per_question"]
        seconds = starts * plan["server_start_s"] + arms * repeats * per_repeat + gsm8k_s
        basis = (
            "assumed: plan.server_start_s, plan.ttft_ms_per_1k_input, plan.tpot_ms, "
            f"plan.gsm8k_s_per_question, {upto}{repeats} repeats (no history: {measured})"
        )
    out["serve"] = {"seconds": seconds, "gpus": gpus * (arms if pair else 1), "basis": basis}

    # gsm8k (the per-arm summary jobs; lm-eval itself runs inside the serve job)
    if "gsm8k" in history:
        out["gsm8k"] = {
            "seconds": history["gsm8k"].seconds,
            "gpus": 0,
            "basis": f"history: {', '.join(history['gsm8k'].files)}",
        }
    else:
        out["gsm8k"] = {
            "seconds": arms * plan["summary_job_s"],
            "gpus": 0,
            "basis": f"assumed: {arms} x plan.summary_job_s {plan['summary_job_s']} s",
        }
    for job in out.values():
        job["gpu_hours"] = job["seconds"] * job["gpus"] / 3600
        # the history job's mtime lets the report tell a job that did not rerun
    for kind, jt in history.items():
        if kind in out and out[kind]["basis"].startswith("history"):
            out[kind]["history_mtime"] = jt.mtime
    return out


def estimate(config: dict, results: Path | str = "results") -> dict[str, Any]:
    results = Path(results)
    cells = {c.cell_id: estimate_cell(config, c, results) for c in loader.cells(config)}
    totals = {
        kind: {
            "seconds": sum(c[kind]["seconds"] for c in cells.values()),
            "gpu_hours": sum(c[kind]["gpu_hours"] for c in cells.values()),
        }
        for kind in job_times.KIND_FILES
    }
    return {
        "kind": job_times.ESTIMATE_KIND,
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "cells": cells,
        "totals": totals,
        "assumptions": dict(config["plan"]),
        # Points whose prompts cannot support report.latency_bounds' claim (issue 32 item 5).
        "warnings": latency_bounds.plan_warnings(config),
    }


def write(est: dict[str, Any], results: Path | str = "results") -> Path:
    path = Path(results) / job_times.ESTIMATE_FILE
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cellbench plan",
        description="Estimate the wall time and GPU-hours of a config's jobs before running them "
        "(from each cell's last jobs in the results folder, else the config's plan assumptions).",
    )
    parser.add_argument("--configfile", default="config/local.yaml")
    parser.add_argument("--results", default="results", help="results folder (default: results)")
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"also write the estimate to RESULTS/{job_times.ESTIMATE_FILE} for the report",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    args = parser.parse_args(argv)
    try:
        config = loader.load(args.configfile)
        est = estimate(config, args.results)
    except (loader.ConfigError, job_times.JobTimeError) as exc:
        print(f"cellbench plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(est, indent=2) if args.json else render(est))
    if args.write:
        print(f"estimate written to {write(est, args.results)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
