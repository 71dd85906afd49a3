"""What a run will be able to see, stated before it starts (`cellbench plan` and the banner at
the start of `snakemake all`): per cell and grid point, the server starts per arm and repeats
per start that a comparison needs to see a change of ``report.target_detectable_pct`` at 80%
power, and the serve job's GPU-hours for that design, GSM8K's full question count included.

The noise at each level comes from the data where there is any: every earlier serve result of
the same cell (same image name, model, tp and ep) in this results folder and in the archive's
runs, each run (and each ``start`` within one, where its points record one) a server start,
its valid repeats the repeats; variance components by ``stats.plan_noise`` on the log scale,
per verdict metric, the noisiest metric deciding: of each repeat's untuned/tuned ratio where one
job interleaves the arms (``serve.interleave_arms``; the paired design the verdict tests), else
of each arm's values, pooled over the arms. A level the history
cannot show (one start only, or one repeat per start) takes the stated noise model,
``plan.noise_start_pct`` and ``plan.noise_repeat_pct``, and says so. Repeats per start follow
Kalibera and Jones (``plan_noise.repeats_per_start``) from what a start and a repeat cost
(the servers' measured ``ready_s`` and the points' durations, else ``plan.server_start_s`` and
the assumed TTFT/TPOT), bounded by ``plan.repeats_per_start_min``/``_max``; starts are capped
by ``plan.max_starts``, and where r* misses the target within that cap more repeats per start
(up to the bound) are tried. A point that cannot reach the target within the caps is named,
with the smallest change it could see.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cellbench.config import loader
from cellbench.config.jobargs import gpus_per_server
from cellbench.contracts.gsm8k_dataset import HUB_DATASET
from cellbench.results import archived
from cellbench.results import loaders as results_loaders
from cellbench.stats import plan_noise
from cellbench.stats.plan_noise import Components

ARMS = loader.ARMS
# The compared serving metrics (stats.comparison.METRICS' keys).
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "output_throughput")
# Questions of GSM8K's test split on the hub (openai/gsm8k, config main): lm-eval's full run.
HUB_TEST_QUESTIONS = 1319

Point = tuple[int, int, int]  # isl, osl, max_concurrency


def gsm8k_questions(config: dict) -> tuple[int, str]:
    """Questions one lm-eval GSM8K run asks, and where that number comes from: the limit, the
    generated set's size, a local file's lines, or the hub test split's size."""
    g = config["gsm8k"]
    if g.get("limit"):
        return int(g["limit"]), "gsm8k.limit"
    if g.get("local_questions"):
        return int(g["local_questions"]), "gsm8k.local_questions"
    dataset = str(g.get("dataset") or HUB_DATASET)
    if dataset == HUB_DATASET:
        return HUB_TEST_QUESTIONS, f"{HUB_DATASET} test split"
    path = Path(dataset)
    if path.is_file():
        with path.open(errors="replace") as f:
            return sum(1 for line in f if line.strip()), f"{dataset} lines"
    return 0, f"{dataset}: size unknown (not counted)"


def _asked_then(root: Path, cell: str) -> int | None:
    """GSM8K questions one arm's lm-eval asked in the cell's last serve job under ``root``
    (its bench.json's gsm8k record, the whole set's size from its GSM8K result), times its
    instances; 0 when it ran none, None when the files do not say."""
    try:
        bench = results_loaders.load_bench(root / cell / "serve" / ARMS[0] / "bench.json", root)
    except (results_loaders.ResultError, OSError):
        return None
    record = bench.data.get("gsm8k", "absent")
    if record is None:
        return 0
    if not isinstance(record, dict):
        return None
    instances = int(record.get("instances") or 1)
    if record.get("limit"):
        return int(record["limit"]) * instances
    try:
        result = results_loaders.load_gsm8k(root / cell / "gsm8k" / f"{ARMS[0]}.json", root)
    except (results_loaders.ResultError, OSError):
        return None
    return int(result.data["n_samples"]) * instances


def gsm8k_change(config: dict, root: Path, cell: str) -> tuple[float, str]:
    """Seconds to add to a serve job timed in the history under ``root`` for GSM8K asking
    another number of questions now (``plan.gsm8k_s_per_question`` each, every arm), and the
    words that say so ('' when nothing changed or the history does not say)."""
    then = _asked_then(root, cell)
    questions, source = gsm8k_questions(config)
    now = questions * int(config["gsm8k"]["instances"])
    if then is None or then == now:
        return 0.0, ""
    per = config["plan"]["gsm8k_s_per_question"]
    delta = len(ARMS) * (now - then) * per
    return delta, (
        f" {'+' if delta >= 0 else '-'} GSM8K {now} questions per arm now ({source}, "
        f"x instances) instead of {then}, x plan.gsm8k_s_per_question {per:g} s"
    )


def _benches(config: dict, cell: loader.Cell, results: Path, root: Path) -> Iterator[tuple]:
    """(source, arm, bench data) of every earlier serve result of the cell: the results
    folder's, then each archived run's; a file seen twice (archived from here) counts once,
    one the checked loader refuses is left out."""
    places = [("results", results)]
    places += [(f"archive {run.ref}", run.path) for run in archived.runs(root)]
    seen: set[str] = set()
    for name, place in places:
        for arm in ARMS:
            path = place / cell.cell_id / "serve" / arm / "bench.json"
            if not path.is_file():
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                data = results_loaders.load_bench(path, place).data
            except results_loaders.ResultError:
                continue
            yield name, arm, data


def _history(config: dict, cell: loader.Cell, results: Path, root: Path) -> dict[str, Any]:
    """Per point and metric, per server start, per arm, the valid values by repeat; per point
    the measured durations; the servers' ready times; the sources read."""
    values: dict[Point, dict[str, dict[tuple, dict[str, dict[int, float]]]]] = {}
    durations: dict[Point, list[float]] = {}
    ready, sources = [], []
    for source, arm, bench in _benches(config, cell, results, root):
        sources.append(source)
        ready.append(float(bench["server"]["ready_s"]))
        for p in bench["points"]:
            if p.get("load_shape", "concurrency") != "concurrency":
                continue  # request-rate points: the plan's grid counts concurrency points
            point = (p["isl"], p["osl"], p["max_concurrency"])
            durations.setdefault(point, []).append(float(p.get("duration") or 0.0))
            if p.get("invalid"):
                continue
            start = (source, p.get("start", 0))
            for metric in METRICS:
                v = p.get(metric)
                if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                    by_start = values.setdefault(point, {}).setdefault(metric, {})
                    by_start.setdefault(start, {}).setdefault(arm, {})[p["repeat"]] = float(v)
    return {"values": values, "durations": durations, "ready": ready, "sources": sources}


def _components(by_start: dict[tuple, dict[str, dict[int, float]]], paired: bool) -> Components:
    """Paired (arms interleaved): of the log-ratio of the two arms' values of each repeat both
    have, per start. Else of each arm's values per start, pooled over the arms."""
    if paired:
        table = []
        for arms in by_start.values():
            if all(arm in arms for arm in ARMS):
                a, b = (arms[arm] for arm in ARMS)
                table.append([a[r] / b[r] for r in sorted(set(a) & set(b))])
        return plan_noise.start_repeat_components(table)
    return plan_noise.pooled(
        plan_noise.start_repeat_components(
            [list(arms[arm].values()) for arms in by_start.values() if arm in arms]
        )
        for arm in ARMS
    )


def _noise(config: dict, comp: Components, paired: bool) -> tuple[float, float, str]:
    """(var_start, var_repeat, basis): the history's components, each level it cannot show
    taken from the noise model. The model and the basis speak per arm (a pair's log-ratio
    holds two arms' spread: twice one arm's variance)."""
    plan, arms = config["plan"], 2.0 if paired else 1.0
    how = " of the pairs' ratio" if paired else ""
    parts, out = [], []
    for name, var, df, key in (
        ("start", comp.var_start, comp.df_start, "noise_start_pct"),
        ("repeat", comp.var_repeat, comp.df_repeat, "noise_repeat_pct"),
    ):
        if var is not None:
            out.append(var)
            shown = plan_noise.var_to_pct(var / arms)
            parts.append(f"{name} {shown:.1f}% per arm measured ({df} df{how})")
        else:
            out.append(arms * plan_noise.pct_to_var(plan[key]))
            parts.append(f"{name} {plan[key]:g}% per arm plan.{key}")
    return out[0], out[1], ", ".join(parts)


def _point_plan(
    config: dict, var_s: float, var_r: float, c_start: float, c_rep: float, paired: bool
) -> dict:
    """Repeats per start (Kalibera and Jones's; more, up to the bound, where that misses the
    target within the cap), starts needed (None: not within the cap) and the change seen."""
    plan = config["plan"]
    target = float(config["report"]["target_detectable_pct"])
    low, high = int(plan["repeats_per_start_min"]), int(plan["repeats_per_start_max"])
    cap = int(plan["max_starts"])
    r = plan_noise.repeats_per_start(var_s, var_r, c_start, c_rep, low, high)
    n = plan_noise.starts_needed(var_s, var_r, r, target, cap, paired)
    # The cheapest split misses within the cap: more repeats per start are what is left.
    while n is None and r < high:
        r += 1
        n = plan_noise.starts_needed(var_s, var_r, r, target, cap, paired)
    seen = plan_noise.detectable_pct(var_s, var_r, n or cap, r, paired=paired)
    return {"starts": n, "repeats_per_start": r, "detectable_pct": seen}


def plan_cell(config: dict, cell: loader.Cell, results: Path, archive_root: Path) -> dict[str, Any]:
    """One cell's plan: per point the starts and repeats per start for the target, the change
    that design sees and the noise it rests on; the cell's starts (its neediest point's, the
    cap where one cannot reach the target), the serve job's seconds and GPU-hours for it."""
    plan, serve = config["plan"], config["serve"]
    paired = bool(serve["interleave_arms"])  # one job interleaves the arms: pairs
    hist = _history(config, cell, results, archive_root)
    c_start = sum(hist["ready"]) / len(hist["ready"]) if hist["ready"] else plan["server_start_s"]
    waves = int(serve["prompts_per_concurrency"]) + int(serve.get("warmups_per_concurrency") or 0)
    points = []
    for g in serve["grid"]:
        for c in serve["concurrency"]:
            key = (g["isl"], g["osl"], c)
            measured = hist["durations"].get(key)
            wave_ms = plan["ttft_ms_per_1k_input"] * g["isl"] / 1000 + plan["tpot_ms"] * g["osl"]
            assumed = waves * wave_ms / 1000
            c_rep = sum(measured) / len(measured) if measured else assumed
            worst = None
            for metric in METRICS:
                comp = _components(hist["values"].get(key, {}).get(metric, {}), paired)
                var_s, var_r, basis = _noise(config, comp, paired)
                step = _point_plan(config, var_s, var_r, c_start, c_rep, paired)
                step.update(metric=metric, noise=basis)
                if worst is None or _needier(step, worst):
                    worst = step
            points.append({"point": f"{key[0]}-{key[1]} c{c}", "repeat_s": c_rep, **worst})
    cap = int(plan["max_starts"])
    starts = max((p["starts"] or cap for p in points), default=0)
    arms = len(ARMS)
    questions, q_basis = gsm8k_questions(config)
    gsm8k_s = arms * questions * int(config["gsm8k"]["instances"]) * plan["gsm8k_s_per_question"]
    per_start = c_start + sum(p["repeats_per_start"] * p["repeat_s"] for p in points)
    seconds = arms * starts * per_start + gsm8k_s
    gpus = gpus_per_server(config, cell) * (arms if serve["interleave_arms"] else 1)
    return {
        "points": points,
        "starts": starts,
        "seconds": seconds,
        "gpu_hours": seconds * gpus / 3600,
        "basis": (
            f"{arms} arms x {starts} starts x ({c_start:.0f} s start + the points' repeats) + "
            f"GSM8K {questions} questions ({q_basis}) x {config['gsm8k']['instances']} "
            f"instances x {arms} arms; history: "
            + (", ".join(sorted(set(hist["sources"]))) or "none")
        ),
    }


def _needier(a: dict, b: dict) -> bool:
    """Whether plan ``a`` asks for more than ``b``: unreachable first, then more starts, then
    the larger change seen."""
    ka = (a["starts"] is None, a["starts"] or 0, a["detectable_pct"])
    kb = (b["starts"] is None, b["starts"] or 0, b["detectable_pct"])
    return ka > kb


def plan(config: dict, results: Path | str, archive_root: Path | str | None = None) -> dict:
    """Every cell's plan, the target and the warnings naming each point that cannot reach
    the target within the caps."""
    results = Path(results)
    root = Path(archive_root) if archive_root is not None else results / "archive"
    cells = {c.cell_id: plan_cell(config, c, results, root) for c in loader.cells(config)}
    target = float(config["report"]["target_detectable_pct"])
    cap = int(config["plan"]["max_starts"])
    warnings = []
    for cell, entry in cells.items():
        for p in entry["points"]:
            if p["starts"] is None:
                seen = p["detectable_pct"]
                warnings.append(
                    f"{cell} {p['point']}: cannot see a {target:g}% change within "
                    f"plan.max_starts {cap} starts x {p['repeats_per_start']} repeats "
                    f"(sees {_pct(seen)} at best, {p['metric']}; noise: {p['noise']})"
                )
    return {"target_pct": target, "max_starts": cap, "cells": cells, "warnings": warnings}


def _pct(value: float) -> str:
    return "nothing" if math.isinf(value) else f"{value:.1f}%"


def render(detect: dict) -> list[str]:
    """The plan as terminal lines: per cell and point the design and what it sees."""
    lines = [
        f"detectable change (target {detect['target_pct']:g}% at 80% power, p < 0.05): "
        "starts per arm x repeats per start"
    ]
    for cell, entry in detect["cells"].items():
        lines.append(
            f"  {cell}: {entry['starts']} starts per arm, {entry['gpu_hours']:.2f} GPU-h "
            f"({entry['basis']})"
        )
        for p in entry["points"]:
            starts = p["starts"] if p["starts"] is not None else f"over {detect['max_starts']}"
            lines.append(
                f"    {p['point']:<16} {starts} starts x {p['repeats_per_start']} repeats: "
                f"sees {_pct(p['detectable_pct'])} ({p['metric']}; noise: {p['noise']})"
            )
    return lines
