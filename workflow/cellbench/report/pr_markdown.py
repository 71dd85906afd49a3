"""One Markdown file per model that can be pasted into a pull request's body as it is.

The shapes are seed 000's (the vLLM PR this project grew from): per cell, a table per metric
(TTFT, TPOT, E2E latency) with ISL-OSL rows, "Triton MoE Untuned" / "Triton MoE Tuned" columns
and an Average row, then GSM8K strict-match and flexible-extract in %. Around them, what a
reviewer needs to trust and reproduce the numbers, all read from the results (never assumed):

* the server command and environment of each arm (bench.json ``server.command``/``server.env``,
  or ``moe_config.env`` in files written before ``server.env`` was recorded);
* the tuning command (tune/summary.json ``argv``) and the config file names with the shape
  fields vLLM matches them by (E, N, device, dtype, block shape, read from the names);
* the evidence that the tuned arm loaded the tuned file: the server's own log line
  ("Using configuration from ... for MoE layer."), as bench.json ``moe_config`` kept it;
* with several repeats, each figure is the median over the repeats ± half their interquartile
  range (the file says so); one repeat, the value alone;
* links to the cell's plots (cellbench.report.plots) that exist beside the report.

A model with several cells (images, TP/EP layouts) gets one section per cell in its file.
The report job writes these files (``report/pr/MODEL.md``); this module also runs alone, e.g.
over an archived run's results, without rerunning anything:

    python -m cellbench.report.pr_markdown --results results --out-dir results/report/pr FILES...
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd

from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import Result, ResultError
from cellbench.report import capacity, comparison_tables, frames, percentile_claims
from cellbench.report.frames import median_spread
from cellbench.stats import core as stats

GSM8K_ROWS = (
    ("exact_match, strict-match", "strict_match"),
    ("exact_match, flexible-extract", "flexible_extract"),
)
SPREAD_NOTE = (
    "Each figure is the median over the {n} repeats of its grid point, ± half their "
    "interquartile range; the Average row averages the medians. Where the count varies, "
    "server starts stopped once the point's answer was known (serve.starts). The verdicts "
    "below compare geometric means over server starts, not these medians."
)
ONE_RUN_NOTE = "One repeat per grid point: each figure is that run's mean (no spread to show)."
PLOTS_REL = PurePosixPath("..")  # from report/pr/MODEL.md to report/


def _fmt(value: float, spread: float | None) -> str:
    if value is None or np.isnan(value):
        return "n/a"
    return f"{value:.2f}" if spread is None else f"{value:.2f} ± {spread:.2f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def metric_table(serve: pd.DataFrame, cell: str, metric: str) -> tuple[list[str], list[list[str]]]:
    """Seed 000's table of one metric for ``cell``: ISL-OSL rows (one per concurrency level
    when there are several), one column per arm, an Average row of the medians."""
    rows = serve[serve.cell == cell]
    arms = [a for a in frames.ARM_LABELS if a in set(rows.arm)]
    several = rows["max_concurrency"].nunique() > 1
    keys = ["isl", "osl", "max_concurrency"]
    header = ["ISL-OSL", *(frames.arm_column(rows, a) for a in arms)]
    body, medians = [], {a: [] for a in arms}
    for key, point_rows in rows.groupby(keys, sort=True):
        isl, osl, conc = (int(k) for k in key)
        label = f"{isl}-{osl} @c{conc}" if several else f"{isl}-{osl}"
        cells = []
        for arm in arms:
            values = point_rows[point_rows.arm == arm][metric].dropna()
            median, spread = median_spread(values)
            medians[arm].append(median)
            cells.append(_fmt(median, spread))
        body.append([label, *cells])
    body.append(["Average", *(_fmt(float(np.mean(medians[a])), None) for a in arms)])
    return header, body


def gsm8k_table(
    gsm: pd.DataFrame, cell: str, labels: dict[str, str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Seed 000's GSM8K table: strict-match and flexible-extract in %, ± the standard error
    lm-eval reported; ``labels``: each arm's column title (``frames.arm_columns``)."""
    labels = labels or frames.ARM_LABELS
    rows = gsm[gsm.cell == cell].set_index("arm")
    arms = [a for a in frames.ARM_LABELS if a in rows.index]
    header = ["Metric", *(labels[a] for a in arms)]
    body = []
    for label, field in GSM8K_ROWS:
        cells = []
        for arm in arms:
            value, stderr = rows.loc[arm, field], rows.loc[arm, f"{field}_stderr"]
            known = stderr is not None and not pd.isna(stderr)
            cells.append(f"{100 * value:.2f}%" + (f" ± {100 * stderr:.2f}" if known else ""))
        body.append([label, *cells])
    return header, body


def config_name_fields(name: str) -> dict[str, str]:
    """The fields of a vLLM fused-MoE config file name, e.g. ``E=64,N=768,device_name=X,
    dtype=fp8_w8a8,block_shape=[128,128].json`` -> {E: 64, N: 768, device_name: X, ...}.
    Commas inside brackets belong to the value."""
    stem = name.removesuffix(".json")
    fields = {}
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", stem):
        key, _, value = part.partition("=")
        fields[key.strip(",")] = value
    return fields


def shape_text(name: str, tuned_dtype: str | None = None) -> str:
    """A config file's shape as a reviewer reads it: E, N, device, dtype, block shape, from
    its name (vLLM's names carry no dtype for 16-bit weights: ``tuned_dtype`` says which)."""
    f = config_name_fields(name)
    dtype = f.get("dtype") or f"not in the name ({tuned_dtype or '16-bit'} weights)"
    return (
        f"E={f.get('E', '?')}, N={f.get('N', '?')}, device {f.get('device_name', '?')}, "
        f"dtype {dtype}, block shape {f.get('block_shape', 'none')}"
    )


def server_command(bench: dict) -> str:
    """The arm's server as seed 000 prints it: its variables, then its command line."""
    server = bench.get("server", {})
    env = server.get("env")
    if env is None:  # files written before server.env: the observed MoE variables
        env = (bench.get("moe_config") or {}).get("env", {})
    command = server.get("command")
    if not command:
        return "# (this bench.json recorded no server command)"
    assignments = " ".join(f"{k}={shlex.quote(portable(str(v)))}" for k, v in sorted(env.items()))
    return (assignments + " " if assignments else "") + shlex.join(map(portable, command))


def portable(word: str) -> str:
    """A command word without this host's paths: an absolute path into the pipeline's results
    (alone or as the value of ``--opt=``) becomes ``results/...``, as the repository lays it
    out, and a host interpreter its name; other paths (a container's) stay as they are."""
    option, eq, value = word.partition("=")
    if eq and option.startswith("-"):
        return f"{option}={portable(value)}"
    if not word.startswith("/"):
        return word
    parts = PurePosixPath(word).parts
    if "results" in parts:  # a pipeline path: from results/ on, as the repository lays it out
        return "/".join(parts[parts.index("results") :])
    if "bin" in parts[:-1] and parts[-1].startswith("python"):  # an interpreter
        return parts[-1]
    return word


_ABSOLUTE = re.compile(r"/[^\s'\"`,;()]+")


def portable_text(text: str) -> str:
    """``portable`` applied to every absolute path inside a line of text (a server's log)."""
    return _ABSOLUTE.sub(lambda m: portable(m.group(0)), text)


def display_title(model: str, model_ids: list[str], built_by: set[str] | None = None) -> str:
    """The PR file's title: the served models' ids, or, for a model served from a folder, the
    config's model name (never a host path) with its origin as the results record it:
    ``built_by``, the model folders' recipe files as the servers' benches read them."""
    ids = [m for m in model_ids if not m.startswith(("/", ".", "results/", "~"))]
    if ids:
        return ", ".join(ids)
    if not model_ids:
        return model
    if built_by == {"cellbench.assets"}:
        return f"{model} (a random-weight model built by the workflow)"
    return f"{model} (served from a folder; the results do not record where the model came from)"


def evidence_lines(bench: dict) -> list[str]:
    """What the arm's server logged about its fused-MoE config (observed, from its log)."""
    moe = bench.get("moe_config") or {}
    return [portable_text(line) for line in moe.get("log_lines") or []]


def _cell_sections(
    cell: str,
    serve: pd.DataFrame,
    gsm: pd.DataFrame,
    benches: dict[str, dict],
    summary: dict | None,
    plots: list[tuple[str, str]],
    claims: pd.DataFrame | None = None,
) -> list[str]:
    image, _, layout = cell.split("/")
    out = [f"## {image}, {layout}", ""]
    digests = sorted({b.get("image_digest") for b in benches.values() if b.get("image_digest")})
    if digests:
        out += [f"Image `{image}`: `{', '.join(digests)}`", ""]
    out += _plan_lines(benches, summary)
    out += _result_lines(cell, serve, gsm, plots, claims)
    return out


def _plan_lines(benches: dict[str, dict], summary: dict | None) -> list[str]:
    """The cell's test plan: each arm's server command, the tuning command and its config
    files, and the fused-MoE config each arm's server loaded."""
    out = ["### Test plan", ""]
    if benches:
        out += ["```bash"]
        for arm in frames.ARM_LABELS:
            if arm in benches:
                out += [f"# {frames.ARM_LABELS[arm]}", server_command(benches[arm])]
        out += ["```", ""]
    if summary is not None:
        argv = [str(a) for a in summary.get("argv", [])]
        out += [
            "Tuning (the kernel tuned "
            + (
                "under the Triton interpreter on the CPU"
                if summary.get("interpreter")
                else f"on {summary.get('device_name')}"
            )
            + f", {summary.get('backend')} kernel, {summary.get('mode')} search):",
            "",
            "```bash",
            shlex.join(["python", "-m", "cellbench.tune", *argv]),
            "```",
            "",
        ]
        names = [summary["config_file"]]
        tuned = benches.get("tuned")
        loaded = sorted(
            {Path(p).name for p in ((tuned or {}).get("moe_config") or {}).get("paths", [])}
        )
        names += [n for n in loaded if n not in names]
        out += ["Config files:", ""]
        out += [f"- `{n}` ({shape_text(n, summary.get('dtype'))})" for n in names]
        out += [""]
    if benches:
        out += ["Fused-MoE config each arm's server loaded, from its own log:", ""]
        for arm in frames.ARM_LABELS:
            if arm not in benches:
                continue
            moe = benches[arm].get("moe_config") or {}
            lines = evidence_lines(benches[arm])
            source = moe.get("source", "not recorded")
            out += [f"- {frames.ARM_LABELS[arm]}: **{source}**"]
            out += [f"  `{line}`" for line in lines] or ["  (no such line in its log)"]
        out += [""]
    return out


def _result_lines(
    cell: str,
    serve: pd.DataFrame,
    gsm: pd.DataFrame,
    plots: list[tuple[str, str]],
    claims: pd.DataFrame | None,
) -> list[str]:
    """The cell's test results: latency tables, percentile claims, GSM8K and plots."""
    out = ["### Test results", ""]
    cell_serve = serve[serve.cell == cell] if len(serve) else serve
    if len(cell_serve):
        counts = cell_serve.groupby(["arm", "isl", "osl", "max_concurrency"]).size()
        repeats = int(counts.max())
        n = str(repeats) if counts.min() == repeats else f"{int(counts.min())} to {repeats}"
        out += [SPREAD_NOTE.format(n=n) if repeats > 1 else ONE_RUN_NOTE, ""]
        for title, metric in frames.LATENCY_TABLES:
            header, body = metric_table(serve, cell, metric)
            out += [f"#### {title}", "", _md_table(header, body), ""]
        out += percentile_claims.section_lines(claims, cell, labels=frames.arm_columns(serve, cell))
    if len(gsm) and (gsm.cell == cell).any():
        n = int(gsm[gsm.cell == cell].n_samples.iloc[0])
        header, body = gsm8k_table(gsm, cell, frames.arm_columns(serve, cell))
        out += [
            "#### GSM8K Accuracy",
            "",
            f"{n} questions; ± the standard error lm-eval reports.",
            "",
            _md_table(header, body),
            "",
        ]
    if plots:
        out += ["#### Plots", ""]
        out += [f"![{name}]({rel})" for name, rel in plots]
        out += [""]
    return out


VERDICT_COLUMNS = {
    "mean_ttft_ms": "TTFT",
    "mean_tpot_ms": "TPOT",
    "mean_e2el_ms": "E2E",
    "output_throughput": "output tok/s",
}


def verdict_lines(serve: pd.DataFrame, cell: str, min_change_pct: float) -> list[str]:
    """Tuned against untuned per grid point, the report's verdicts (``comparison``): each
    metric's verdict and change, the pairs the point used and why it stopped, its invalid
    repeats. Nothing where an arm is missing or the arms cannot differ (report.md says so)."""
    if not len(serve) or not {"untuned", "tuned"} <= set(serve[serve.cell == cell].arm):
        return []
    untuned = serve[(serve.cell == cell) & (serve.arm == "untuned")]
    tuned = serve[(serve.cell == cell) & (serve.arm == "tuned")]
    if frames.arms_cannot_differ(serve, cell):
        table = comparison_tables.render_repeats(untuned, tuned)
        return ["#### Server starts per point", "", *table[2:]] if table else []
    rows = comparison_tables.point_verdicts(
        untuned, tuned, min_change_pct=min_change_pct, labels=VERDICT_COLUMNS
    )
    if not rows:
        return []
    header = ["ISL-OSL", *VERDICT_COLUMNS.values(), "starts used", "invalid A/B"]
    return [
        "#### Verdicts, tuned against untuned",
        "",
        "Per grid point and metric: the verdict (better, worse, equivalent within "
        f"+-{min_change_pct:g}%, or inconclusive with the smallest change it could have seen), "
        "the change of the geometric mean over server starts with its interval, the starts "
        "the point used and why it stopped, and repeats that failed or were invalid (left out "
        "of the test, counted here).",
        "",
        _md_table(header, [[str(r.get(h, "")) for h in header] for r in rows]),
        "",
    ]


def model_of(cell: str) -> str:
    return cell.split("/")[1]


def render_model(
    model: str,
    loaded: list[Result],
    report_dir: Path | None = None,
    claims: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> str:
    """The PR-ready Markdown of ``model`` from checked results; ``report_dir``: the folder
    holding ``plots/`` (linked relative to ``report_dir/pr``), when there is one; ``claims``:
    the percentile claims (``percentile_claims.claims_frame``), shown after the latencies."""
    serve, gsm, _ = frames.cell_frames(loaded)
    benches: dict[str, dict[str, dict]] = {}
    summaries: dict[str, dict] = {}
    for r in loaded:
        if r.kind == result_file.BENCH:
            benches.setdefault(r.data["cell"], {})[r.data["arm"]] = r.data
        elif r.kind == result_file.TUNE:
            summaries["/".join(r.path.parts[-5:-2])] = r.data
    cells = sorted(
        c for c in set(benches) | set(summaries) | set(gsm.get("cell", [])) if model_of(c) == model
    )
    if not cells:
        raise ValueError(f"no results of model {model!r} among the inputs")
    model_ids = sorted(
        {b["server"].get("model_id") for c in cells for b in benches.get(c, {}).values()} - {None}
    )
    built_by = set()
    if "model_built_by" in serve:
        built_by = set(serve.loc[serve["cell"].isin(cells), "model_built_by"].dropna())
    title = display_title(model, model_ids, built_by)
    lines = [f"# {title}", ""]
    if model_ids and model_ids != [model]:
        lines += [f"cellbench model `{model}`; {len(cells)} cell(s).", ""]
    for cell in cells:
        plots = []
        if report_dir is not None:
            from cellbench.report import plots as plots_mod  # matplotlib only where plots exist

            for name, by_format in plots_mod.report_relative(cell).items():
                if (report_dir / by_format["png"]).is_file():
                    plots.append((name, str(PLOTS_REL / by_format["png"])))
        bench = benches.get(cell, {})
        lines += _cell_sections(cell, serve, gsm, bench, summaries.get(cell), plots, claims)
        same = frames.arms_cannot_differ(serve, cell)
        lines += capacity.section_lines(loaded, cell, min_change_pct, f"{PLOTS_REL}/", same)
        lines += verdict_lines(serve, cell, min_change_pct)
    return "\n".join(lines).rstrip() + "\n"


def models_of(loaded: Iterable[Result]) -> list[str]:
    """The models that the results cover."""
    found = set()
    for r in loaded:
        if r.kind in (result_file.BENCH, result_file.GSM8K):
            found.add(model_of(r.data["cell"]))
        elif r.kind == result_file.TUNE:
            found.add(r.path.parts[-4])
    return sorted(found)


def write_all(
    loaded: list[Result],
    out_dir: Path,
    report_dir: Path | None = None,
    claims: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> list[Path]:
    """One ``MODEL.md`` per model under ``out_dir``, each written atomically."""
    written = []
    for model in models_of(loaded):
        path = Path(out_dir) / f"{model}.md"
        atomicio.write_text(path, render_model(model, loaded, report_dir, claims, min_change_pct))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.report.pr_markdown",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--results", default="results", help="the results folder (live or archived)"
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument(
        "--report-dir", help="the folder holding plots/ (cellbench.report.plots) to link, if any"
    )
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        loaded = frames.load_inputs(args.files, args.results)
    except ResultError as exc:
        print(f"cellbench pr_markdown: error: {exc}", file=sys.stderr)
        return 1
    report_dir = Path(args.report_dir) if args.report_dir else None
    for path in write_all(loaded, Path(args.out_dir), report_dir):
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
