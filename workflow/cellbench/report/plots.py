"""Figures per cell, PNG and SVG, for people who compare curves faster than tables.

``results/report/plots/{cell}/``:

- ``latency``: TTFT, TPOT and E2E by ISL-OSL (and concurrency), the arms side by side; bar =
  median over the repeats, error bar = the repeats' min to max;
- ``arm_change``: per metric and grid point, the tuned arm's change of the geometric mean over
  server starts against the untuned arm, with the verdict's interval and its colour (better,
  worse, equivalent, inconclusive: ``comparison.compare_serve``, the report's own test);
- ``tuner_speedup``: per batch size M, the tuner's pick against the baseline it timed beside
  it (speed-up = baseline time / pick time), and the pick's roofline fraction where recorded;
- ``gsm8k``: strict-match and flexible-extract per arm with their standard errors, and the
  questions the tuned arm fixed or broke (paired by question, ``comparison.compare_gsm8k``);
- ``bump/bump``: only when the cell has a previous archived run with other results: each
  arm's change from that run to now, per metric and grid point, with the digests in the title.

Every input goes through ``cellbench.results.loaders``. A figure whose data is absent still says so
in
its own panel (a run without GSM8K, a tuner summary without a baseline), so the set of files
per cell is fixed and a rule can declare it; ``bump`` is the one drawn only when it applies.

    python -m cellbench.report.plots --results results --cell CELL \
        --out-dir results/report/plots/CELL [--archive-root results/archive]
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path, PurePosixPath

import matplotlib

matplotlib.use("Agg")  # files only; no display on a build machine

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import ResultError  # noqa: E402
from cellbench.report import frames, tidy
from cellbench.results import archived
from cellbench.stats import comparison
from cellbench.stats import core as stats

# Drawn for every cell, in this order; ``bump`` only with a previous run (in bump/).
PLOT_NAMES = ("latency", "arm_change", "tuner_speedup", "gsm8k", "bump")
ALWAYS = PLOT_NAMES[:-1]
FORMATS = ("png", "svg")
DPI = 100
LATENCY_PANELS = (
    ("TTFT (ms)", "mean_ttft_ms"),
    ("TPOT (ms)", "mean_tpot_ms"),
    ("E2E latency (ms)", "mean_e2el_ms"),
)
METRIC_LABELS = {
    "mean_ttft_ms": "TTFT",
    "mean_tpot_ms": "TPOT",
    "mean_e2el_ms": "E2E",
    "output_throughput": "output tok/s",
}
ARM_COLORS = {"untuned": "#8c8c8c", "tuned": "#1f77b4"}
VERDICT_COLORS = {
    "better": "#2ca02c",
    "worse": "#d62728",
    "equivalent": "#1f77b4",
    "inconclusive": "#7f7f7f",
}


def plot_dir(results_dir: str | Path, cell: str) -> Path:
    """Where a cell's figures lie under a results folder (live or an archived run)."""
    return Path(results_dir) / "report" / "plots" / cell


def report_relative(cell: str) -> dict[str, dict[str, PurePosixPath]]:
    """Every figure of ``cell`` relative to the report folder (where report.md lies):
    name -> format -> path, as Markdown links them."""
    base = PurePosixPath("plots", cell)
    out = {}
    for name in PLOT_NAMES:
        folder = base / "bump" if name == "bump" else base
        out[name] = {fmt: folder / f"{name}.{fmt}" for fmt in FORMATS}
    return out


def plot_paths(results_dir: str | Path, cell: str) -> dict[str, dict[str, Path]]:
    """Every figure of ``cell`` that may exist under ``results_dir`` (live or an archived run):
    name -> format -> path. ``bump`` exists only when the cell had a previous run with other
    results; check ``is_file()`` before linking one."""
    report_dir = Path(results_dir) / "report"
    return {
        name: {fmt: report_dir / rel for fmt, rel in by_format.items()}
        for name, by_format in report_relative(cell).items()
    }


def save_figure(fig: plt.Figure, stem: Path) -> list[Path]:
    """The figure as PNG and SVG beside each other, each written atomically."""
    written = []
    for fmt in FORMATS:
        buffer = io.BytesIO()
        # A fixed date and no software tag in SVG/PNG metadata: same data, same bytes.
        metadata = {"Date": None} if fmt == "svg" else {"Software": None}
        # SVG text as text (searchable, readable by screen readers), not as glyph outlines.
        with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cellbench"}):
            fig.savefig(buffer, format=fmt, dpi=DPI, metadata=metadata)
        path = stem.with_suffix(f".{fmt}")
        atomicio.write_bytes(path, buffer.getvalue())
        written.append(path)
    plt.close(fig)
    return written


def _empty(ax: plt.Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _level(frame: pd.DataFrame) -> str:
    """The column that tells load levels apart: the load label (``c16``, ``2 req/s``) where
    the frame has one, else the concurrency."""
    return "load" if "load" in frame else "max_concurrency"


def _point_labels(frame: pd.DataFrame) -> tuple[list[tuple], list[str]]:
    level = _level(frame)
    points = sorted(
        {(int(i), int(o), x) for i, o, x in frame[["isl", "osl", level]].values.tolist()},
        key=lambda p: (p[0], p[1], str(p[2])),
    )
    several = len({p[2] for p in points}) > 1
    prefix = "@" if level == "load" else "@c"
    labels = [f"{i}-{o} {prefix}{x}" if several else f"{i}-{o}" for i, o, x in points]
    return points, labels


def latency_figure(serve: pd.DataFrame, cell: str) -> plt.Figure:
    rows = serve[serve.cell == cell] if len(serve) else serve
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    fig.suptitle(f"{cell}: latency by ISL-OSL (median of repeats, bars = min to max)")
    if not len(rows):
        for ax in axes:
            _empty(ax, "no serving results")
        return fig
    points, labels = _point_labels(rows)
    level = _level(rows)
    arms = [a for a in ("untuned", "tuned") if a in set(rows.arm)]
    width = 0.8 / max(len(arms), 1)
    for ax, (title, metric) in zip(axes, LATENCY_PANELS, strict=True):
        for i, arm in enumerate(arms):
            med, low, high = [], [], []
            for isl, osl, load in points:
                at = (rows.isl == isl) & (rows.osl == osl) & (rows[level] == load)
                v = rows[(rows.arm == arm) & at][metric].dropna()
                m = float(v.median()) if len(v) else math.nan
                med.append(m)
                low.append(m - float(v.min()) if len(v) else 0.0)
                high.append(float(v.max()) - m if len(v) else 0.0)
            xs = [x + (i - (len(arms) - 1) / 2) * width for x in range(len(points))]
            ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=frames.ARM_LABELS[arm],
                   color=ARM_COLORS[arm])  # fmt: skip
        ax.set_title(title)
        ax.set_xticks(range(len(points)), labels, rotation=30, ha="right", fontsize="small")
        ax.set_xlabel("ISL-OSL")
        ax.set_ylabel(title)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    return fig


def _change_panel(ax: plt.Axes, rows: list[dict], title: str) -> None:
    """Horizontal change-% bars with their 95% intervals, coloured by verdict."""
    if not rows:
        _empty(ax, "no grid point measured on both sides")
        return
    level = "load" if all("load" in r for r in rows) else "max_concurrency"
    several = len({r[level] for r in rows}) > 1
    prefix = "@" if level == "load" else "@c"
    names = [
        f"{METRIC_LABELS.get(r['metric'], r['metric'])} {r['isl']}-{r['osl']}"
        + (f" {prefix}{r[level]}" if several else "")
        for r in rows
    ]
    ys = list(range(len(rows)))
    changes = [r["change_pct"] for r in rows]
    err = [
        [0.0 if math.isnan(r["ci_low"]) else max(r["change_pct"] - r["ci_low"], 0.0) for r in rows],
        [
            0.0 if math.isnan(r["ci_high"]) else max(r["ci_high"] - r["change_pct"], 0.0)
            for r in rows
        ],
    ]
    colors = [VERDICT_COLORS.get(r["verdict"], "#7f7f7f") for r in rows]
    ax.barh(ys, changes, xerr=err, color=colors, capsize=3)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(ys, names, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("change of the geometric mean over server starts, % (the verdict's interval)")
    ax.set_title(title, fontsize="medium")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in VERDICT_COLORS.values()]
    ax.legend(handles, list(VERDICT_COLORS), fontsize="x-small", loc="best")


def arm_change_figure(
    serve: pd.DataFrame, cell: str, min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT
) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(9, 5))
    title = f"{cell}: tuned (B) vs untuned (A)"
    if not len(serve) or not {"untuned", "tuned"} <= set(serve[serve.cell == cell].arm):
        _empty(ax, "both arms were not measured")
    elif frames.arms_cannot_differ(serve, cell):
        _empty(ax, "not compared: neither arm's server ran a Triton fused-MoE kernel,\n"
                   "so the tuned configs reached no kernel")  # fmt: skip
    else:
        rows = comparison.compare_serve(
            frames.select(serve, cell=cell, arm="untuned"),
            frames.select(serve, cell=cell, arm="tuned"),
            min_change_pct=min_change_pct,
        )
        _change_panel(ax, rows, title)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def tuner_speedup_figure(summary: dict | None, cell: str) -> plt.Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    fig.suptitle(f"{cell}: tuned kernel vs the tuner's baseline, per batch size M")
    entries = sorted((summary or {}).get("entries", {}).items(), key=lambda kv: int(kv[0]))
    timed = [
        (int(m), e["baseline"])
        for m, e in entries
        if (e.get("baseline") or {}).get("time_us")
        and (e.get("baseline") or {}).get("tuned_time_us")
    ]
    if timed:
        ms = [m for m, _ in timed]
        speedup = [b["time_us"] / b["tuned_time_us"] for _, b in timed]
        sources = sorted({str(b.get("source")) for _, b in timed})
        left.plot(ms, speedup, marker="o")
        left.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        left.set_xscale("log", base=2)
        left.set_xlabel("batch size M (tokens)")
        left.set_ylabel("speed-up (baseline time / pick time)")
        left.set_title(f"pick vs baseline ({', '.join(sources)}), timed side by side",
                       fontsize="medium")  # fmt: skip
    else:
        _empty(left, "no baseline timed beside the pick\n(summary without baselines)")
    fractions = [(int(m), tidy.roofline_fraction(e)) for m, e in entries]
    fractions = [(m, f) for m, f in fractions if f is not None]
    if fractions:
        right.plot([m for m, _ in fractions], [f for _, f in fractions], marker="s",
                   color="#ff7f0e")  # fmt: skip
        right.set_xscale("log", base=2)
        right.set_ylim(0, max(1.0, max(f for _, f in fractions) * 1.1))
        right.set_xlabel("batch size M (tokens)")
        right.set_ylabel("roofline fraction")
        right.set_title("pick's fraction of the roofline", fontsize="medium")
    else:
        _empty(right, "no roofline recorded")
    fig.tight_layout()
    return fig


def gsm8k_figure(gsm: pd.DataFrame, cell: str) -> plt.Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    fig.suptitle(f"{cell}: GSM8K")
    rows = gsm[gsm.cell == cell] if len(gsm) else gsm
    arms = [a for a in ("untuned", "tuned") if len(rows) and a in set(rows.arm)]
    if not arms:
        _empty(left, "no GSM8K results")
        _empty(right, "no GSM8K results")
        fig.tight_layout()
        return fig
    metrics = [(label, field) for label, _, field in comparison.GSM8K_METRICS]
    width = 0.8 / len(arms)
    top = 0.0
    for i, arm in enumerate(arms):
        r = rows[rows.arm == arm].iloc[0]
        values = [100 * float(r[f]) for _, f in metrics]
        errors = [100 * float(r.get(f"{f}_stderr") or 0.0) for _, f in metrics]
        xs = [x + (i - (len(arms) - 1) / 2) * width for x in range(len(metrics))]
        left.bar(xs, values, width, yerr=errors, capsize=3, label=frames.ARM_LABELS[arm],
                 color=ARM_COLORS[arm])  # fmt: skip
        top = max(top, *(v + e for v, e in zip(values, errors, strict=True)))
    # A random model scores 0: keep the axis at 0..something, not centred on 0.
    left.set_ylim(0, max(top * 1.15, 5.0))
    left.set_xticks(range(len(metrics)), [label for label, _ in metrics])
    left.set_ylabel("accuracy, % (± stderr)")
    left.set_title(f"{int(rows.iloc[0].n_samples)} questions", fontsize="medium")
    left.legend(fontsize="small")
    a = frames.gsm8k_side(gsm, cell=cell, arm="untuned")
    b = frames.gsm8k_side(gsm, cell=cell, arm="tuned")
    paired = [r for r in comparison.compare_gsm8k(a, b) if r["paired"]] if a and b else []
    if paired:
        kinds = ("both_right", "both_wrong", "fixed", "broken")
        width = 0.8 / len(paired)
        for i, r in enumerate(paired):
            xs = [x + (i - (len(paired) - 1) / 2) * width for x in range(len(kinds))]
            right.bar(xs, [r[k] for k in kinds], width, label=r["metric"])
        right.set_xticks(range(len(kinds)), [k.replace("_", " ") for k in kinds])
        right.set_ylabel("questions")
        right.set_title(f"untuned -> tuned, paired by {paired[0]['paired_by']}",
                        fontsize="medium")  # fmt: skip
        right.legend(fontsize="small")
    else:
        _empty(right, "questions not paired\n(one arm only, or no per-question log)")
    fig.tight_layout()
    return fig


def bump_figure(
    serve_prev: pd.DataFrame,
    serve_now: pd.DataFrame,
    cell: str,
    previous: str,
    digests: tuple[str, str],
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> plt.Figure:
    arms = [a for a in ("untuned", "tuned") if a in set(serve_prev.arm) & set(serve_now.arm)]
    fig, axes = plt.subplots(1, max(len(arms), 1), figsize=(8 * max(len(arms), 1), 5))
    axes = [axes] if not isinstance(axes, list | tuple) and not hasattr(axes, "__len__") else axes
    fig.suptitle(f"{cell}: previous run {previous} ({digests[0]}) -> now ({digests[1]})")
    if not arms:
        _empty(axes[0], "no arm measured in both runs")
    for ax, arm in zip(axes, arms, strict=False):
        rows = comparison.compare_serve(
            serve_prev[serve_prev.arm == arm],
            serve_now[serve_now.arm == arm],
            min_change_pct=min_change_pct,
        )
        _change_panel(ax, rows, f"{arm} arm: now vs previous")
    fig.tight_layout()
    return fig


def previous_run_plots(
    results_dir: Path,
    archive_root: Path,
    cell: str,
    out_dir: Path,
    min_change_pct: float,
) -> list[Path]:
    """``bump/bump.{png,svg}`` when ``cell`` has a previous archived run with other results
    (``archived.previous_run``, the report's own choice); nothing otherwise."""
    if not Path(archive_root).is_dir():
        return []
    run = archived.previous_run(archive_root, results_dir, cell)
    if run is None:
        return []
    serve_now = _frames(results_dir, cell)[0]
    serve_prev = _frames(run.path, cell)[0]
    manifest = archived.read_manifest(run.path) or {}
    image = cell.split("/")[0]
    digests = (
        frames.digest_of(serve_prev, cell, manifest.get("images", {}).get(image)),
        frames.digest_of(serve_now, cell, None),
    )
    fig = bump_figure(serve_prev, serve_now, cell, run.ref, digests, min_change_pct)
    return save_figure(fig, out_dir / "bump" / "bump")


def _frames(root: Path, cell: str):
    files = tidy.stage_files(Path(root), [cell], whole=False)
    loaded = frames.load_inputs(files, root)
    summary = next((r.data for r in loaded if r.kind == result_file.TUNE), None)
    return (*frames.cell_frames(loaded), summary)


def draw_cell(
    results_dir: str | Path,
    cell: str,
    out_dir: str | Path,
    archive_root: str | Path | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> list[Path]:
    """Every figure of ``cell`` (read from ``results_dir``, live or an archived run folder)
    into ``out_dir``; ``bump`` too when ``archive_root`` holds a previous run of the cell.
    Raises ``ResultError`` for a bad input before any figure is written. A stale ``bump``
    (from an earlier previous run) is removed when there is none now."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    serve, gsm, _tune, summary = _frames(results_dir, cell)
    figures = {
        "latency": latency_figure(serve, cell),
        "arm_change": arm_change_figure(serve, cell, min_change_pct),
        "tuner_speedup": tuner_speedup_figure(summary, cell),
        "gsm8k": gsm8k_figure(gsm, cell),
    }
    written = []
    for name, fig in figures.items():
        written += save_figure(fig, out_dir / name)
    # Always there (the plots rule declares it), empty without a previous run.
    (out_dir / "bump").mkdir(parents=True, exist_ok=True)
    bump = []
    if archive_root is not None:
        bump = previous_run_plots(results_dir, Path(archive_root), cell, out_dir, min_change_pct)
    if not bump:
        for fmt in FORMATS:
            (out_dir / "bump" / f"bump.{fmt}").unlink(missing_ok=True)
    return written + bump


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.report.plots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--results", default="results", help="results/ or an archived run")
    parser.add_argument("--cell", required=True, help="IMAGE/MODEL/tpN-epM")
    parser.add_argument("--out-dir", help="default: RESULTS/report/plots/CELL")
    parser.add_argument("--archive-root", help="draw bump/ against the cell's previous run")
    parser.add_argument(
        "--min-change-pct", type=float, default=stats.DEFAULT_MIN_CHANGE_PCT,
        help="the equivalence margin in %% (report.min_change_pct)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if len(args.cell.split("/")) != 3:
        parser.error(f"--cell must be IMAGE/MODEL/tpN-epM, got {args.cell!r}")
    if not args.min_change_pct > 0:
        parser.error(f"--min-change-pct must be a number > 0, got {args.min_change_pct}")
    out_dir = Path(args.out_dir) if args.out_dir else plot_dir(args.results, args.cell)
    try:
        written = draw_cell(
            args.results, args.cell, out_dir, args.archive_root, args.min_change_pct
        )
    except ResultError as exc:
        print(f"cellbench plots: error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
