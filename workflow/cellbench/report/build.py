"""Tidy tables over every cell and a PR-ready Markdown report.

Inputs are the stage outputs (their schemas are the interface): `tune/summary.json`,
`serve/{arm}/bench.json` and `gsm8k/{arm}.json` per cell. Outputs: `serve.csv` (one row per
cell, arm, repeat and grid point), `gsm8k.csv` (one row per cell and arm), `tune.csv` (one row
per cell and batch size) and `report.md` in the seeds' shapes (TTFT, TPOT, E2E tables by
ISL-OSL with arms as columns and an Average row; GSM8K strict-match and flexible-extract),
followed by diff sections (untuned vs tuned; image A vs image B) that tell change from noise
(`cellbench.stats.comparison`, the one comparison also used for a run against an archived run).

Every input goes through `cellbench.results.loaders` (schema, invariants, recorded checksum); a bad
one stops the report with a message naming the file, the field and the job to rerun, and the
previous report stays in place: the new one is built in a temporary folder and swapped in
whole, `INDEX.json` (the rule's output) last.

Image comparisons (`results/compare/A-vs-B/MODEL/tpN-epM/bench.json`, serve.compare_images),
when given, are what the image-vs-image section of the tuned arm uses ("interleaved on one
host"); otherwise, and for the untuned arm, it compares the separately run cells ("separate
runs"). Their points go to `compare.csv`.

    python -m cellbench.report --results results --out-dir results/report \
        [--min-change-pct 2] [FILES...]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from cellbench.common import atomicio
from cellbench.common.gitstate import git_state
from cellbench.common.paths import REPO_DIR
from cellbench.gates import check as gates_mod
from cellbench.gsm8k.evaluate import instance_spread_lines
from cellbench.report import plots, pr_markdown, tidy
from cellbench.report.frames import (
    ARM_LABELS,
    LATENCY_TABLES,
    arm_column,
    arms_cannot_differ,
    cell_frames,
    comparison_frame,
    gsm8k_side,
    load_inputs,
    median_spread,
    select,
)
from cellbench.report.previous import previous_run_sections
from cellbench.results import loaders as results_mod
from cellbench.results.loaders import ResultError
from cellbench.stats import comparison
from cellbench.stats import core as stats


def _fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _md(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, disable_numparse=True)


# One statistic wherever serving latency is shown (these tables, the PR files, the verdicts
# and the figures): per grid point, the median over the repeats of each repeat's mean, with
# half the interquartile range of the repeats as its spread.
LATENCY_NOTE = (
    "Latency tables: each figure is the median over the repeats of that point's per-repeat "
    "mean latency, ± half the repeats' interquartile range (no ± with one repeat); the Average "
    "row averages the medians."
)


def latency_tables(serve: pd.DataFrame, cell: str) -> list[str]:
    """The seeds' three tables for one cell: ISL-OSL rows, arms as columns, an Average row.
    Per point, the median over repeats ± half their IQR (LATENCY_NOTE); concurrency levels
    and request rates are kept apart (one row each)."""

    out = [LATENCY_NOTE, ""]
    rows = serve[serve.cell == cell]
    # Concurrency and request-rate points side by side, kept apart by their load label.
    level = "load" if "load" in rows else "max_concurrency"
    keys = ["isl", "osl", level] if level in rows else ["isl", "osl"]
    several = rows[level].nunique() > 1 if level in rows else False
    arms = [a for a in ARM_LABELS if a in set(rows.arm)]
    for title, metric in LATENCY_TABLES:
        points = sorted({tuple(k) for k in rows[keys].itertuples(index=False)})
        labels = [_point_label(*(tuple(k) + (None,))[:3], several) for k in points]
        if level == "load":
            labels = [f"{i}-{o} @{x}" if several else f"{i}-{o}" for i, o, x in points]
        table = pd.DataFrame({"ISL-OSL": labels})
        average = {"ISL-OSL": "Average"}
        for arm in arms:
            shown, medians = [], []
            for key in points:
                mask = rows.arm == arm
                for k, v in zip(keys, key, strict=True):
                    mask &= rows[k] == v
                median, spread = median_spread(rows[mask][metric].dropna())
                medians.append(median)
                shown.append(_fmt(median) + (f" ± {_fmt(spread)}" if spread is not None else ""))
            table[arm_column(rows, arm)] = shown
            known = [m for m in medians if not math.isnan(m)]
            average[arm_column(rows, arm)] = _fmt(sum(known) / len(known) if known else None)
        table = pd.concat([table, pd.DataFrame([average])], ignore_index=True)
        out.append(f"#### {title}\n\n{_md(table)}\n")
    return out


OBSERVED_COLUMNS = (
    ("Goodput (req/s)", "request_goodput", 2),
    ("Server TTFT (ms)", "server_mean_ttft_ms", 2),
    ("Server ITL (ms)", "server_mean_itl_ms", 2),
    ("Max waiting", "server_max_waiting", 0),
    ("Mean power (W)", "mean_power_w", 1),
    ("J/token", "joules_per_output_token", 4),
)


def observed_lines(serve: pd.DataFrame, cell: str) -> list[str]:
    """Per point and arm: goodput under the SLOs, the server's own latencies and queue from
    /metrics, and GPU power and energy per output token; then J/token and mean power per arm
    (all points' energy over all their output tokens and durations). Only the columns some
    point measured; nothing when none did (a server without /metrics, no GPU, no SLO)."""
    rows = serve[serve.cell == cell]
    present = [c for c in OBSERVED_COLUMNS if c[1] in rows and rows[c[1]].notna().any()]
    if not present:
        return []
    table = []
    for (isl, osl, load, arm), group in rows.groupby(["isl", "osl", "load", "arm"], sort=True):
        entry = {"ISL-OSL": f"{isl}-{osl}", "load": load, "arm": arm_column(rows, arm)}
        for title, column, digits in present:
            entry[title] = _fmt(group[column].mean(), digits)
        table.append(entry)
    out = ["#### Load shapes, server metrics and energy", "", _md(pd.DataFrame(table)), ""]
    if "energy_j" in rows and rows.energy_j.notna().any():
        per_arm = []
        for arm, group in rows[rows.energy_j.notna()].groupby("arm", sort=True):
            tokens, seconds = group.total_output_tokens.sum(), group.duration.sum()
            per_arm.append(
                {
                    "arm": arm_column(rows, arm),
                    "J/token": _fmt(group.energy_j.sum() / tokens if tokens else None, 4),
                    "Mean power (W)": _fmt(group.energy_j.sum() / seconds, 1),
                }
            )
        measured = rows[rows.energy_j.notna()]
        how = "; ".join(sorted(set(measured.get("telemetry_how", pd.Series(dtype=str)).dropna())))
        if "gpus_shared_by_sides" in measured and measured.gpus_shared_by_sides.eq(True).any():
            how += (
                "; both arms' servers ran on these GPUs (one measured at a time), so each "
                "figure includes the other, idle server's draw"
            )
        out += [f"Energy per arm (telemetry: {how}):", "", _md(pd.DataFrame(per_arm)), ""]
    return out


def gsm8k_table(gsm: pd.DataFrame, cell: str) -> str:
    rows = gsm[gsm.cell == cell].set_index("arm")
    arms = [a for a in ARM_LABELS if a in rows.index]
    table = pd.DataFrame({"Metric": ["exact_match, strict-match", "exact_match, flexible-extract"]})
    for arm in arms:
        r = rows.loc[arm]
        table[ARM_LABELS[arm]] = [
            f"{100 * r.strict_match:.2f}% ± {100 * (r.strict_match_stderr or 0):.2f}",
            f"{100 * r.flexible_extract:.2f}% ± {100 * (r.flexible_extract_stderr or 0):.2f}",
        ]

    api = rows.iloc[0].get("api")
    how = f", {api} API" if isinstance(api, str) else ""
    spread = instance_spread_lines(
        {ARM_LABELS[a]: json.loads(rows.loc[a].get("instances") or "[]") for a in arms}
    )
    extra = "\n" + "\n".join(spread) + "\n" if spread else ""
    head = f"#### GSM8K ({int(rows.iloc[0].n_samples)} questions{how})"
    return f"{head}\n\n{_md(table)}\n{extra}"


def _point_label(isl: int, osl: int, conc: int, several_levels: bool) -> str:
    return f"{isl}-{osl} @c{conc}" if several_levels else f"{isl}-{osl}"


def tune_table(tune: pd.DataFrame, cell: str) -> str:
    rows = tune[tune.cell == cell].sort_values("batch_size")
    if rows.empty:
        return ""
    first = rows.iloc[0]
    cols = [c for c in rows.columns if c.startswith("config.")]
    table = pd.DataFrame({"M": rows.batch_size})
    for c in cols:
        table[c.removeprefix("config.")] = rows[c].astype("Int64").astype(str)
    for c in ("time_us", "fused_time_us", "roofline_fraction"):
        if c in rows:
            table[c] = rows[c].map(lambda v: _fmt(v, 3))
    # What the pick was timed against, beside it in the same process (tuner/baseline.py):
    # vLLM's shipped config for the shape, or its default rule.
    if "baseline.time_us" in rows:
        table["baseline"] = rows["baseline.source"].fillna("n/a")
        table["baseline_us"] = rows["baseline.time_us"].map(lambda v: _fmt(v, 3))
        # The pick timed again beside the baseline: the gain compares these two.
        table["pick_us"] = rows["baseline.tuned_time_us"].map(lambda v: _fmt(v, 3))
        table["gain %"] = rows["improvement_pct"].map(lambda v: _fmt(v, 1))
    where = "Triton interpreter on the CPU" if first.get("interpreter") else first.device_name
    return (
        f"#### Tuned configs: `{first.config_file}` ({first['backend']} kernel, {first['mode']} "
        f"search, {where})\n\n{_md(table)}\n"
    )


def image_sections(
    serve: pd.DataFrame,
    compare: pd.DataFrame | None = None,
    gsm: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> list[str]:
    """Image A vs image B per (model, tp, ep) and arm, through ``comparison.render``. The tuned
    arm's serving comes from an image comparison when there is one (both images served side by
    side and interleaved: "interleaved on one host"); otherwise from the two cells' own runs
    ("separate runs"), which also pair their GSM8K questions."""
    compare = compare if compare is not None else pd.DataFrame()
    gsm = gsm if gsm is not None else pd.DataFrame()
    images = set(serve.image) if len(serve) else set()
    layouts = set(map(tuple, serve[["model", "tp", "ep"]].values.tolist())) if len(serve) else set()
    if len(compare):
        images |= set(compare.image)
        layouts |= set(map(tuple, compare[["model", "tp", "ep"]].values.tolist()))
    lines = []
    images = sorted(images)
    for i, img_a in enumerate(images):
        for img_b in images[i + 1 :]:
            for model, tp, ep in sorted(layouts):
                interleaved = pd.DataFrame()
                if len(compare):
                    interleaved = compare[
                        (compare.model == model)
                        & (compare.tp == tp)
                        & (compare.ep == ep)
                        & (
                            ((compare.image_a == img_a) & (compare.image_b == img_b))
                            | ((compare.image_a == img_b) & (compare.image_b == img_a))
                        )
                    ]
                for arm in ARM_LABELS:
                    gsm_a = gsm_b = None
                    if arm == "tuned" and len(interleaved):
                        source, label = interleaved, "interleaved on one host"
                        ka, kb = {"image": img_a}, {"image": img_b}
                    else:
                        source, label = serve, "separate runs"
                        ka = {"image": img_a, "model": model, "tp": tp, "ep": ep, "arm": arm}
                        kb = {**ka, "image": img_b}
                        if not len(serve):
                            continue
                        layout = f"{model}/tp{tp}-ep{ep}"
                        gsm_a = gsm8k_side(gsm, cell=f"{img_a}/{layout}", arm=arm)
                        gsm_b = gsm8k_side(gsm, cell=f"{img_b}/{layout}", arm=arm)
                    title = f"## {img_a} (A) vs {img_b} (B): {model} tp{tp}-ep{ep}, {arm} ({label})"
                    note = ""
                    if label != "separate runs":
                        digests = {
                            img: sorted(set(source[source.image == img].image_digest.dropna()))
                            for img in (img_a, img_b)
                        }
                        note = (
                            "Both images' servers ran at once on this host, their repeats "
                            "alternated (A B, B A, ...); each served with its own cell's tuned "
                            f"configs. A: `{', '.join(digests[img_a]) or 'n/a'}`, "
                            f"B: `{', '.join(digests[img_b]) or 'n/a'}`."
                            + (
                                " Both sides ran the same image digest: this table measures the "
                                "interleaving, not a difference between images."
                                if source.same_environment.any()
                                else ""
                            )
                        )
                    lines += comparison.render(
                        title,
                        select(source, **ka),
                        select(source, **kb),
                        gsm_a,
                        gsm_b,
                        note=note,
                        min_change_pct=min_change_pct,
                    )
    return lines


def parallelism_note(serve: pd.DataFrame, cell: str) -> list[str]:
    """A warning when a cell's servers ran with other TP/EP sizes than the cell names (the
    local runtime's transformers serve runs one process). A server whose command did not say
    (older files, a custom command) gets no warning: nothing was observed either way."""
    if not len(serve) or "tp_served" not in serve or not (serve.cell == cell).any():
        return []
    rows = serve[serve.cell == cell]
    want = (int(rows.tp.iloc[0]), int(rows.ep.iloc[0]))
    served = sorted(
        {(r.arm, r.tp_served, r.ep_served) for r in rows.itertuples()}, key=lambda t: t[0]
    )

    def known(value: object) -> bool:
        return value is not None and not pd.isna(value)

    odd = [
        (arm, tp, ep)
        for arm, tp, ep in served
        if known(tp) and known(ep) and (int(tp), int(ep)) != want
    ]
    if not odd:
        return []
    ran = "; ".join(f"{arm}: tp {int(tp)}, ep {int(ep)}" for arm, tp, ep in odd)
    return [
        f"> **Parallelism differs from the cell's.** The cell asks for tp {want[0]}, "
        f"ep {want[1]}; its servers were started with {ran} (read from their command "
        "lines).",
        "",
    ]


def moe_config_lines(serve: pd.DataFrame, cell: str) -> list[str]:
    """Per arm, the fused-MoE config its server's log says it used: the evidence that the
    tuned arm ran the tuned configs (and the untuned arm did not)."""
    if not len(serve) or "moe_source" not in serve or not (serve.cell == cell).any():
        return []
    rows = serve[serve.cell == cell].drop_duplicates("arm").sort_values("arm", ascending=False)
    parts = []
    for r in rows.itertuples():
        if r.moe_source is None or (isinstance(r.moe_source, float) and pd.isna(r.moe_source)):
            continue
        name = r.arm if r.arm_label == r.arm else f"{r.arm} (labelled {r.arm_label})"
        files = ", ".join(f"`{Path(p).name}`" for p in str(r.moe_paths).split(", ") if p)
        what = {
            "tuned": f"its tuned file {files}",
            "shipped": f"the image's own file {files}",
            "default": "no file found: vLLM's default rule",
            "none seen": "no fused-MoE config line (no Triton MoE path)",
            "mixed": f"processes disagreed ({files})",
        }.get(r.moe_source, r.moe_source)
        parts.append(f"{name}: {what}")
    if not parts:
        return []
    return ["Fused-MoE config, from the servers' logs: " + "; ".join(parts) + ".", ""]


NO_TRITON_MOE_NOTE = (
    "Not compared: neither arm's server logged a fused-MoE config (their MoE ran without a "
    "Triton kernel, e.g. on vLLM's CPU backend), so nothing read the tuned configs and the two "
    "arms ran the same code. The arms cannot differ here; any gap between their numbers above "
    "is noise, and no verdict is given."
)


def render(
    serve: pd.DataFrame,
    gsm: pd.DataFrame,
    tune: pd.DataFrame,
    runtime: str,
    compare: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    previous: list[str] | None = None,
    gates: dict[str, dict] | None = None,
    figures: dict[str, list[tuple[str, str]]] | None = None,
    run: list[str] | None = None,
) -> str:
    """report.md; ``previous``: sections comparing cells with their previous archived run
    (``previous.previous_run_sections``), placed after the cells' own sections; ``gates``: each
    cell's gate.json (``cellbench.gates.check``), shown under its GSM8K table; ``figures``: per
    cell,
    (name, path relative to report.md) of its plots (``cellbench.report.plots``), linked at its
    end."""
    cells = sorted(
        set(serve.get("cell", [])) | set(gsm.get("cell", [])) | set(tune.get("cell", []))
    )
    lines = ["# cellbench report", "", *(run or [])]
    if runtime == "local" and cells and all(arms_cannot_differ(serve, c) for c in cells):
        lines += [
            "> **Embedded default, served by vLLM on the CPU.** A tiny random-weight "
            "Qwen3-MoE-architecture model served by vLLM's CPU build, whose MoE runs a CPU "
            "backend rather than a Triton kernel: neither arm's server reads fused-MoE configs, "
            "so the arms cannot differ (each cell says so instead of comparing them). These "
            "figures measure this pipeline on this machine, not any GPU or real model. GSM8K "
            "scores of a random model are near zero by design.",
            "",
        ]
    elif runtime == "local" and len(tune) and not tune["interpreter"].fillna(True).any():
        # Every cell tuned with compiled Triton: the local runtime on a GPU (config/gpu-local.yaml).
        devices = ", ".join(sorted(set(tune["device_name"].dropna())))
        lines += [
            f"> **Local runtime on a GPU ({devices}).** A random-weight Qwen3-MoE-architecture "
            "model built by the workflow, served by `transformers serve` on the GPU with the "
            "project's Triton fused-MoE kernel (compiled) as its experts; the kernel tuned on "
            "the same GPU. The tuned arm's server loads the tuned configs (each cell's "
            "*Fused-MoE config* line shows what each server's log said). Serving overheads are "
            "transformers', not vLLM's. GSM8K scores of a random model are near zero by design.",
            "",
        ]
    elif runtime == "local":
        lines += [
            "> **Embedded default.** A tiny random-weight Qwen3-MoE-architecture model served "
            "by `transformers serve` on the CPU with the project's Triton fused-MoE kernel as its "
            "experts, run by the Triton interpreter; the kernel tuned under that interpreter. "
            "The tuned arm's server loads the tuned configs (each cell's *Fused-MoE config* line "
            "shows what each server's log said), so the arms differ for real, but in "
            "interpreter time: these figures measure this pipeline on this machine, not any GPU "
            "or real model. GSM8K scores of a random model are near zero by design.",
            "",
        ]
    for cell in cells:
        lines += [f"## {cell}", ""]
        digests = sorted(set(serve[serve.cell == cell].image_digest.dropna())) if len(serve) else []
        if digests:
            lines += [f"Image: `{', '.join(digests)}`", ""]
        lines += parallelism_note(serve, cell)
        lines += moe_config_lines(serve, cell)
        if len(tune):
            lines.append(tune_table(tune, cell))
        if len(serve) and (serve.cell == cell).any():
            lines += latency_tables(serve, cell)
            lines += observed_lines(serve, cell)
        if len(gsm) and (gsm.cell == cell).any():
            lines.append(gsm8k_table(gsm, cell))
        lines += gates_mod.report_lines((gates or {}).get(cell))
        if len(serve) and {"untuned", "tuned"} <= set(serve[serve.cell == cell].arm):
            if arms_cannot_differ(serve, cell):
                # No serving verdicts; GSM8K still paired: two runs of the same code (A/A).
                lines += comparison.render(
                    "#### Untuned (A) vs tuned (B)",
                    None,
                    None,
                    gsm8k_side(gsm, cell=cell, arm="untuned"),
                    gsm8k_side(gsm, cell=cell, arm="tuned"),
                    note=NO_TRITON_MOE_NOTE,
                    min_change_pct=min_change_pct,
                )
            else:
                lines += comparison.render(
                    "#### Untuned (A) vs tuned (B)",
                    select(serve, cell=cell, arm="untuned"),
                    select(serve, cell=cell, arm="tuned"),
                    gsm8k_side(gsm, cell=cell, arm="untuned"),
                    gsm8k_side(gsm, cell=cell, arm="tuned"),
                    min_change_pct=min_change_pct,
                )
        lines += figure_lines((figures or {}).get(cell, []))
    lines += previous or []
    lines += image_sections(serve, compare, gsm, min_change_pct)
    lines += ["", comparison.footer(min_change_pct), ""]
    return "\n".join(lines)


def _values(frame: pd.DataFrame, column: str) -> str:
    if column not in frame:
        return "n/a"
    found = sorted({v for v in frame[column].dropna().tolist()}, key=str)
    return ", ".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
                     for v in found) or "n/a"  # fmt: skip


def run_lines(
    serve: pd.DataFrame,
    tune: pd.DataFrame,
    runtime: str,
    min_change_pct: float,
    written: str,
    git: dict,
) -> list[str]:
    """What a reader needs to judge the numbers: when the report was written, from which
    commit, and the settings the measurements ran with (as the result files record them)."""
    commit = git.get("commit") or "unknown (not a git checkout)"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    lines = ["## Run", "", f"- Written {written} UTC from commit `{commit}`; runtime {runtime}."]
    if len(serve):
        grid = sorted({(int(i), int(o)) for i, o in zip(serve.isl, serve.osl, strict=True)})
        repeats = serve.groupby(["cell", "arm", "isl", "osl"])["repeat"].nunique()
        low, high = int(repeats.min()), int(repeats.max())
        span = str(low) if low == high else f"{low}-{high}"
        lines.append(
            f"- Serving: ISL-OSL {', '.join(f'{i}-{o}' for i, o in grid)}; concurrency "
            f"{_values(serve, 'max_concurrency')}; {_values(serve, 'num_prompts')} prompts per "
            f"point; {span} repeats per point and arm."
        )
    if len(tune):
        lines.append(
            f"- Tuner: backend {_values(tune, 'backend')}, mode {_values(tune, 'mode')}, batch "
            f"sizes {_values(tune, 'batch_size')}, device {_values(tune, 'device_name')}."
        )
    lines += [f"- Verdicts call a change below {min_change_pct:g}% within noise.", ""]
    return lines


def figure_lines(figures: list[tuple[str, str]]) -> list[str]:
    """Markdown image links to a cell's plots (PNG; the SVG lies beside each)."""
    if not figures:
        return []
    lines = ["#### Figures", ""]
    for name, rel in figures:
        if rel.startswith(MISSING):  # said, not linked: a link to nothing breaks --report
            lines += [f"Figure `{name}` is missing: {rel.removeprefix(MISSING)}", ""]
        else:
            lines += [f"![{name}]({rel})", ""]
    return lines


MISSING = "missing:"


PLOTS_FOLDER = "plots"
PR_FOLDER = "pr"  # one PR-ready Markdown file per model (cellbench.report.pr_markdown)


def cell_figures(out_dir: Path, cells: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Per cell, the plots that exist under ``out_dir/plots`` (drawn by the plots jobs before
    the report runs), as (name, path relative to report.md)."""

    found: dict[str, list[tuple[str, str]]] = {}
    for cell in cells:
        drawn = (out_dir / PLOTS_FOLDER / cell).is_dir()  # its plots job has run
        for name, paths in plots.report_relative(cell).items():
            if (out_dir / paths["png"]).is_file():
                found.setdefault(cell, []).append((name, str(paths["png"])))
            elif drawn and name != "bump":  # bump is drawn only for a changed cell
                rebuild = f"snakemake --cores 2 {out_dir / paths['png']}"
                found.setdefault(cell, []).append((name, f"{MISSING}rebuild it: `{rebuild}`"))
    return found


def _carry_plots(out_dir: Path, staging: Path) -> Path | None:
    """Move the plots folder (other jobs' outputs) from the current report into the new one,
    so that swapping the report in keeps them; returns where it came from, for undoing."""
    source = out_dir / PLOTS_FOLDER
    if not source.is_dir():
        return None
    source.rename(staging / PLOTS_FOLDER)
    return source


INDEX_NAME = "INDEX.json"


def write_report(
    files: Iterable[str | Path],
    out_dir: str | Path,
    results: str | Path = "results",
    runtime: str = "docker",
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    archive_root: str | Path | None = None,
    run: str = tidy.LIVE_RUN,
    digests: dict[str, str] | None = None,
) -> Path:
    """Check every input, build the tables and report.md in a temporary folder beside
    ``out_dir``, and put it in ``out_dir``'s place only once whole, with ``INDEX.json`` (the
    files written, the inputs read and their checksums) written last. A bad input raises
    ``ResultError`` before anything of ``out_dir`` is touched. ``min_change_pct``: the smallest
    serving change a verdict calls better or worse (``report.min_change_pct``). With
    ``archive_root``, each cell whose results differ from its previous archived run gets a
    previous-vs-now section (``previous.previous_run_sections``). ``tidy.parquet`` and
    ``tidy.csv`` (``cellbench.report.tidy``) carry ``run`` (``live``, or an archived run's
    LABEL/RUN) and take a cell's digest from ``digests`` (image -> digest) when its serve
    results do not record one. Plots already under ``out_dir/plots`` (the plots jobs') are
    linked from report.md and kept."""
    if not min_change_pct >= 0:
        raise ValueError(f"min_change_pct must be a number >= 0, got {min_change_pct}")
    loaded = load_inputs(files, results)
    serve, gsm, tune = cell_frames(loaded)
    compare = comparison_frame(loaded)
    out_dir = Path(out_dir)
    tables = [("serve", serve), ("gsm8k", gsm), ("tune", tune)]
    if len(compare):
        tables.append(("compare", compare))
    long_table = tidy.tidy_frame(loaded, run, digests)
    all_cells = set(serve.get("cell", [])) | set(gsm.get("cell", [])) | set(tune.get("cell", []))
    figures = cell_figures(out_dir, sorted(all_cells))
    staging = atomicio.staging_dir(out_dir.parent, f".{out_dir.name}.")
    carried = None
    try:
        for name, df in tables:
            atomicio.write_text(staging / f"{name}.csv", df.to_csv(index=False))
        tidy.write_tidy(long_table, staging)
        previous = None
        if archive_root is not None:
            cells = (
                set(serve.get("cell", [])) | set(gsm.get("cell", [])) | set(tune.get("cell", []))
            )
            previous = previous_run_sections(
                archive_root, results, cells, min_change_pct=min_change_pct
            )
        gates = {r.data["cell"]: r.data for r in loaded if r.kind == results_mod.GATE}

        written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        git = git_state(REPO_DIR)
        run_info = run_lines(serve, tune, runtime, min_change_pct, written, git)
        text = render(
            serve, gsm, tune, runtime, compare, min_change_pct, previous, gates, figures, run_info
        )
        atomicio.write_text(staging / "report.md", text)

        # One PR-ready file per model, its plot links checked against out_dir's plots.
        pr_files = pr_markdown.write_all(loaded, staging / PR_FOLDER, report_dir=out_dir)
        index = {
            "kind": "report_index",
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": {
                **{
                    p.name: atomicio.sha256_file(p)
                    for p in sorted(staging.iterdir())
                    if p.is_file()
                },
                **{f"{PR_FOLDER}/{p.name}": atomicio.sha256_file(p) for p in pr_files},
            },
            "inputs": [r.index_entry() for r in loaded],
        }
        atomicio.write_json(staging / INDEX_NAME, index)  # last: the rule's output
        carried = _carry_plots(out_dir, staging)
        atomicio.replace_dir(staging, out_dir)
    except BaseException:
        if carried is not None and (staging / PLOTS_FOLDER).is_dir():
            (staging / PLOTS_FOLDER).rename(carried)  # the plots jobs' files go back
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.md"


def _kept(out_dir: Path) -> str:
    report = out_dir / "report.md"
    if report.is_file():
        when = datetime.fromtimestamp(report.stat().st_mtime, UTC).isoformat(timespec="seconds")
        return f"the previous report was kept: {report} (written {when})"
    return f"no report was written, and there was none before in {out_dir}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--results", default="results")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--runtime", default="docker", choices=["docker", "local"])
    parser.add_argument(
        "--min-change-pct",
        type=float,
        default=stats.DEFAULT_MIN_CHANGE_PCT,
        help="smallest serving change in %% called better or worse (report.min_change_pct)",
    )
    parser.add_argument(
        "--archive-root", help="compare each cell with its previous run archived here"
    )
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if not args.min_change_pct >= 0:  # also refuses nan
        parser.error(f"--min-change-pct must be a number >= 0, got {args.min_change_pct}")
    out_dir = Path(args.out_dir)
    try:
        # The whole-run report refuses a cell with a stage result missing, naming each.
        results_mod.check_whole_files(args.files)
        path = write_report(
            args.files,
            out_dir,
            args.results,
            args.runtime,
            args.min_change_pct,
            archive_root=args.archive_root,
        )
    except ResultError as exc:
        print(f"cellbench report: error: {exc}", file=sys.stderr)
        print(f"cellbench report: {_kept(out_dir)}", file=sys.stderr)
        return 1
    except BaseException:
        print(f"cellbench report: failed; {_kept(out_dir)}", file=sys.stderr)
        raise
    print(f"report written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
