"""The sections of report.md, one cell at a time: latency tables by ISL-OSL with the arms as
columns, what was observed per point, GSM8K and tune tables, the image comparisons, and the
notes on parallelism and on which fused-MoE config each arm's server used. Rendered from
``frames``; ``build`` puts them together.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from cellbench.gsm8k.evaluate import instance_spread_lines
from cellbench.report import comparison_tables
from cellbench.report.frames import (
    ARM_LABELS,
    LATENCY_TABLES,
    arm_column,
    gsm8k_side,
    median_spread,
    select,
)
from cellbench.results import job_times
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
        if "planned_gpu_overlap" in measured and measured.planned_gpu_overlap.eq(True).any():
            how += (
                "; the job put both arms' servers on these GPUs (one measured at a time), so each "
                "figure includes the other, idle server's draw"
            )
        out += [f"Energy per arm (telemetry: {how}):", "", _md(pd.DataFrame(per_arm)), ""]
    return out


def gsm8k_table(gsm: pd.DataFrame, cell: str, labels: dict[str, str] | None = None) -> str:
    """The GSM8K scores per arm; ``labels``: each arm's column title (``arm_columns``)."""
    labels = labels or ARM_LABELS
    rows = gsm[gsm.cell == cell].set_index("arm")
    arms = [a for a in ARM_LABELS if a in rows.index]
    table = pd.DataFrame({"Metric": ["exact_match, strict-match", "exact_match, flexible-extract"]})
    for arm in arms:
        r = rows.loc[arm]
        table[labels[arm]] = [
            f"{100 * r.strict_match:.2f}% ± {100 * (r.strict_match_stderr or 0):.2f}",
            f"{100 * r.flexible_extract:.2f}% ± {100 * (r.flexible_extract_stderr or 0):.2f}",
        ]

    api = rows.iloc[0].get("api")
    how = f", {api} API" if isinstance(api, str) else ""
    spread = instance_spread_lines(
        {labels[a]: json.loads(rows.loc[a].get("instances") or "[]") for a in arms}
    )
    extra = "\n" + "\n".join(spread) + "\n" if spread else ""
    head = f"#### GSM8K ({int(rows.iloc[0].n_samples)} questions{how})"
    return f"{head}\n\n{_md(table)}\n{extra}"


def served_lines(serve: pd.DataFrame, cell: str) -> list[str]:
    """Which vLLM served each arm of ``cell``, as its running server answered ``GET /version``
    (bench.json ``server.version``); for vLLM servers that gave no version, that they did not.
    Nothing for servers of other programs, which are not asked."""
    if not len(serve) or "server_version" not in serve:
        return []
    rows = serve[serve.cell == cell]
    arms = [a for a in ARM_LABELS if (rows.arm == a).any()]
    said = {a: sorted(set(rows[rows.arm == a].server_version.dropna())) for a in arms}
    by_vllm = "server_program" in rows and (rows.server_program == "vllm").any()
    if not any(said.values()):
        if not by_vllm:
            return []
        return ["Served by vLLM; no arm's server gave its version (`GET /version`).", ""]

    def text(versions: list[str]) -> str:
        return "vLLM " + " / ".join(versions) if versions else "a server that gave no version"

    if len(arms) > 1 and all(v == said[arms[0]] for v in said.values()):
        who = f"{text(said[arms[0]])} (both arms)"
    else:
        who = "; ".join(f"{a}: {text(said[a])}" for a in arms)
    return [f"Served by {who}, as each arm's running server answered `GET /version`.", ""]


def _point_label(isl: int, osl: int, conc: int, several_levels: bool) -> str:
    return f"{isl}-{osl} @c{conc}" if several_levels else f"{isl}-{osl}"


TUNE_NOTE = (
    "search_us is the pick's time in the search; baseline_us and pick_us are vLLM's own config "
    "for the shape and the pick timed side by side in one process. gain % compares baseline_us "
    "with the slower of the pick's two times, so a pick slower than the baseline in either "
    "shows a negative gain. Where the side-by-side time was no faster, the tuned file holds "
    "the baseline's config (kept: baseline; the row's config is the baseline's, its times and "
    "gain the pick's)."
)


def _pick_search_us(rows: pd.DataFrame) -> pd.Series:
    """The pick's own search time: where the baseline was kept, the pick moved to tuned_pick."""
    search = rows["time_us"] if "time_us" in rows else pd.Series(float("nan"), index=rows.index)
    if "tuned_pick.time_us" in rows and "kept" in rows:
        search = search.where(rows["kept"] != "baseline", rows["tuned_pick.time_us"])
    return search


def _shown_gain(base_us: float, pick_us: float, search_us: float, recorded: float) -> float:
    """The gain against the slower of the pick's two times. The summary's improvement_pct
    compares the side-by-side times only (the results loader holds it to exactly that), so a
    pick the search timed slower than the baseline would show a gain its search contradicts."""
    times = [t for t in (pick_us, search_us) if isinstance(t, float | int) and not pd.isna(t)]
    if pd.isna(base_us) or not times or not base_us:
        return recorded
    return 100.0 * (base_us - max(times)) / base_us


def _tune_counts(first: pd.Series) -> str:
    """What this tune timed itself, and what it read back from an earlier run's log."""
    if pd.isna(first.get("candidates_timed")):
        return ""
    text = (
        f"This run timed {int(first.candidates_timed)} candidates and compiled "
        f"{int(first.new_kernels)} new kernels"
    )
    resumed = first.get("resumed_log_records")
    aside = first.get("log_set_aside")
    if not pd.isna(aside) and aside:
        text += f"; an earlier run's log ({int(aside)} records, another image's) was not resumed"
    elif not pd.isna(resumed) and resumed:
        text += f"; {int(resumed)} records were resumed from an earlier run of this image"
    return text + ".\n\n"


def tune_table(tune: pd.DataFrame, cell: str) -> str:
    rows = tune[tune.cell == cell].sort_values("batch_size")
    if rows.empty:
        return ""
    first = rows.iloc[0]
    cols = [c for c in rows.columns if c.startswith("config.")]
    table = pd.DataFrame({"M": rows.batch_size})
    for c in cols:
        table[c.removeprefix("config.")] = rows[c].astype("Int64").astype(str)
    search = _pick_search_us(rows)
    table["search_us"] = search.map(lambda v: _fmt(v, 3))
    for c in ("fused_time_us", "roofline_fraction"):
        if c in rows:
            table[c] = rows[c].map(lambda v: _fmt(v, 3))
    note = ""
    # What the pick was timed against, beside it in the same process (tuner/baseline.py):
    # vLLM's shipped config for the shape, or its default rule.
    if "baseline.time_us" in rows:
        if "kept" in rows:
            table["kept"] = rows["kept"].map(lambda k: "baseline" if k == "baseline" else "pick")
        table["baseline"] = rows["baseline.source"].fillna("n/a")
        table["baseline_us"] = rows["baseline.time_us"].map(lambda v: _fmt(v, 3))
        # The pick timed again beside the baseline: the gain compares these two.
        table["pick_us"] = rows["baseline.tuned_time_us"].map(lambda v: _fmt(v, 3))
        gains = [
            _shown_gain(b, p, q, g)
            for b, p, q, g in zip(
                rows["baseline.time_us"], rows["baseline.tuned_time_us"], search,
                rows["improvement_pct"], strict=True,
            )
        ]  # fmt: skip
        table["gain %"] = [_fmt(g, 1) for g in gains]
        note = f"{TUNE_NOTE}\n\n"
    where = "Triton interpreter on the CPU" if first.get("interpreter") else first.device_name
    return (
        f"#### Tuned configs: `{first.config_file}` ({first['backend']} kernel, {first['mode']} "
        f"search, {where})\n\n{_tune_counts(first)}{_md(table)}\n{note}"
    )


def image_sections(
    serve: pd.DataFrame,
    compare: pd.DataFrame | None = None,
    gsm: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> list[str]:
    """Image A vs image B per (model, tp, ep) and arm, through ``comparison_tables.render``.
    The tuned arm's serving comes from an image comparison when there is one (both images
    served side by side and interleaved: "interleaved on one host"); otherwise from the two
    cells' own runs ("separate runs"), which also pair their GSM8K questions."""
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
                    lines += comparison_tables.render(
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


def cost_section(results: Path, cells: list[str], run_label: str | None) -> list[str]:
    """The plan's estimate (written when the run of ``run_label`` started) against each job's
    measured wall, per cell and job kind; nothing when the run wrote no estimate (or no label
    is given: an archived run's own report)."""
    est = None if run_label is None else job_times.read_estimate(results, run_label)
    if est is None:
        return []
    lines = [
        "## Cost: the plan's estimate against the jobs' walls",
        "",
        f"Estimated when the run started ({est.get('written', '?')}, `cellbench plan`); actual: "
        "each job's wall as Snakemake measured it (`results/benchmarks/`).",
        "",
        "| Cell | Job | Estimate (s) | Actual (s) | Actual / estimate | GPU-hours (est.) | Basis |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for cell in cells:
        planned = est["cells"].get(cell)
        if not planned:
            continue
        actual = job_times.cell_job_times(results, cell)
        for kind, job in planned.items():
            got = actual.get(kind)
            if got is None:
                shown, ratio = "not run", ""
            elif job.get("history_mtime") == got.mtime:
                shown = f"{got.seconds:.1f}"
                ratio = "not rerun (the estimate is this job's own wall)"
            else:
                shown = f"{got.seconds:.1f}"
                ratio = f"{got.seconds / job['seconds']:.2f}" if job["seconds"] > 0 else ""
            lines.append(
                f"| {cell} | {kind} | {job['seconds']:.1f} | {shown} | {ratio} | "
                f"{job['gpu_hours']:.2f} | {job['basis']} |"
            )
    return [*lines, ""]
