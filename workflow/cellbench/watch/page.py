"""The static history page of one ROCm version: one figure per cell and metric across the
archived runs (a line per arm and grid point, Otava's change points marked), a table of the
change points, and every run linked to its report and archive folder.

    python -m cellbench.watch.page --label LABEL [--archive-root results/archive]
        [--out-dir results/history/LABEL] [--max-pvalue 0.01] [--min-magnitude-pct 0]

Writes, each atomically and the page last: ``history.csv``, ``history.parquet``,
``change_points.csv``, ``plots/<cell>/<metric>.svg`` and ``.png``, and ``index.html`` (the
figures inlined, so the page is one file a browser opens as it is).
"""

from __future__ import annotations

import argparse
import html
import io
import os
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cellbench.common import atomicio  # noqa: E402
from cellbench.watch import history  # noqa: E402

UNITS = {"mean_ttft_ms": "ms", "mean_tpot_ms": "ms", "mean_e2el_ms": "ms",
         "output_throughput": "tokens/s", "strict_match": "accuracy"}  # fmt: skip


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _tick(rows: pd.DataFrame, run: str) -> str:
    """A run's axis label: its time, and the vLLM version its servers answered, if any."""
    said = sorted({str(v) for v in rows[rows.run == run].vllm_version.dropna()})
    return run[:16] + (f"\nvLLM {'/'.join(said)}" if said else "")


def figure(rows: pd.DataFrame, points: pd.DataFrame, cell: str, metric: str) -> plt.Figure:
    """One cell and metric: x = the runs in time order, a line per (arm, point); each change
    point a dashed line at its run with a triangle, its artists' ids ``changepoint-N``."""
    order = list(dict.fromkeys(rows.sort_values(["time", "run"]).run))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for (arm, point), part in rows.groupby(["arm", "point"], sort=True):
        xs = [order.index(r) for r in part.run]
        ax.plot(xs, part.value, marker="o", label=f"{arm} {point}")
    marked = points[(points.cell == cell) & (points.metric == metric)]
    for n, cp in enumerate(marked.itertuples()):
        x = order.index(cp.run) - 0.5
        line = ax.axvline(x, color="crimson", linestyle="--", linewidth=1)
        line.set_gid(f"changepoint-{n}")
        tip = ax.plot([x], [cp.mean_after], marker="v", color="crimson", markersize=9)[0]
        tip.set_gid(f"changepoint-{n}-marker")
        ax.annotate(
            f"{cp.arm} {cp.point}: {cp.shift_pct:+.1f}% (p={cp.pvalue:.2g})",
            (x, cp.mean_after),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
            color="crimson",
        )
    ax.set_xticks(range(len(order)), [_tick(rows, r) for r in order], rotation=30, fontsize=7)
    ax.set_ylabel(f"{metric} ({UNITS.get(metric, '')})")
    ax.set_title(f"{cell}: {metric}", fontsize=9)
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig


def _save(fig: plt.Figure, base: Path) -> str:
    """Write ``base.svg`` and ``base.png``; return the SVG's text (to inline it)."""
    out = {}
    for fmt in ("svg", "png"):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=100)
        atomicio.write_bytes(base.with_suffix(f".{fmt}"), buffer.getvalue())
        out[fmt] = buffer.getvalue()
    plt.close(fig)
    text = out["svg"].decode()
    return text[text.index("<svg") :]


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in frame)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_rows(hist: history.History, run_link: str) -> list[list[str]]:
    rows = hist.rows
    out = []
    for run, part in rows.groupby("run", sort=False):
        folder = f"{run_link}/{run}"
        versions = sorted({str(v) for v in part.vllm_version.dropna()}) or ["n/a"]
        digests = sorted({str(d) for d in part.digest.dropna()})
        out.append([
            html.escape(str(part.time.iloc[0])),
            f'<a class="run" href="{html.escape(folder)}/">{html.escape(run)}</a>',
            f'<a href="{html.escape(folder)}/report/report.md">report</a>',
            html.escape(", ".join(d[:19] for d in digests)),
            html.escape(", ".join(versions)),
        ])  # fmt: skip
    return out


def since_last(rows: pd.DataFrame) -> list[list[str]]:
    """Per series, the newest run's median against the run before it (medians only: the
    report's previous-run sections carry the verdicts)."""
    order = list(dict.fromkeys(rows.sort_values(["time", "run"]).run))
    if len(order) < 2:
        return []
    before, now = order[-2], order[-1]
    keys = history.SERIES_KEYS
    a = rows[rows.run == before].set_index(keys)["value"]
    b = rows[rows.run == now].set_index(keys)["value"]
    out = []
    for key in sorted(set(a.index) & set(b.index)):
        change = (b[key] / a[key] - 1) * 100 if a[key] else float("nan")
        out.append([html.escape(str(k)) for k in key]
                   + [f"{a[key]:.4g}", f"{b[key]:.4g}", f"{change:+.1f}%"])  # fmt: skip
    return out


def render(hist: history.History, points: pd.DataFrame, out_dir: Path, run_link: str) -> str:
    """Draw every figure under ``out_dir/plots`` and return the page's HTML."""
    sections = []
    for (cell, metric), part in hist.rows.groupby(["cell", "metric"], sort=True):
        svg = _save(figure(part, points, cell, metric), out_dir / "plots" / slug(cell) / metric)
        n = int(((points.cell == cell) & (points.metric == metric)).sum())
        sections.append(
            f'<figure class="plot" data-cell="{html.escape(cell)}" data-metric="{metric}" '
            f'data-change-points="{n}">{svg}<figcaption>{html.escape(cell)}: {metric}; '
            f"{n} change point(s)</figcaption></figure>"
        )
    cp_rows = [
        [html.escape(str(x)) for x in (r.cell, r.arm, r.point, r.metric, r.run_before, r.run)]
        + [f"{r.shift_pct:+.1f}%", f"{r.pvalue:.3g}", f"{r.mean_before:.4g}", f"{r.mean_after:.4g}"]
        for r in points.itertuples()
    ]
    cp_table = _table(cp_rows, ["cell", "arm", "point", "metric", "last run before",
                                "first run after", "shift", "p-value", "mean before",
                                "mean after"])  # fmt: skip
    left = "".join(f"<li>{html.escape(x)}</li>" for x in hist.left_out) or "<li>none</li>"
    runs = _table(_run_rows(hist, run_link), ["time", "run", "report", "digest", "vLLM"])
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>History {html.escape(hist.label)}</title>
<style>body{{font-family:sans-serif;margin:1em}} table{{border-collapse:collapse;font-size:80%}}
td,th{{border:1px solid #ccc;padding:2px 6px}} figure{{display:inline-block;margin:0.5em}}</style>
</head><body>
<h1>History of {html.escape(hist.label)}</h1>
<p>{hist.rows.run.nunique()} archived runs; each value is the median of a point's repeats in one
run. Change points: Apache Otava (E-divisive, then Hunter's merge), one search per series.</p>
<h2>Change points</h2>{cp_table}
<h2 id="since-last">Since the last nightly</h2>
<p>The newest run against the one before it: medians of the repeats, no test (the report's
previous-run sections give the verdicts).</p>
{_table(since_last(hist.rows), ["cell", "arm", "point", "metric", "before", "now", "change"])}
<h2>Runs</h2>{runs}
<p>Left out:</p><ul>{left}</ul>
<h2>Figures</h2>
{"".join(sections)}
</body></html>
"""


def write_page(
    archive_root: Path, label: str, out_dir: Path, *, max_pvalue: float, min_magnitude_pct: float
) -> Path:
    hist = history.build(archive_root, label)
    points = history.change_points(
        hist.rows, max_pvalue=max_pvalue, min_magnitude_pct=min_magnitude_pct
    )
    history.write_tables(hist, points, out_dir)
    run_link = os.path.relpath(Path(archive_root) / label, out_dir)
    text = render(hist, points, Path(out_dir), run_link)
    atomicio.write_text(Path(out_dir) / "index.html", text)  # last: the rule's output
    return Path(out_dir) / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.watch.page",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--label", required=True)
    parser.add_argument("--archive-root", type=Path, default=Path("results/archive"))
    parser.add_argument("--out-dir", type=Path, help="default: results/history/LABEL")
    parser.add_argument("--max-pvalue", type=float, default=0.01)
    parser.add_argument("--min-magnitude-pct", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not 0 < args.max_pvalue < 1:
        parser.error(f"--max-pvalue = {args.max_pvalue}: expected a number in (0, 1)")
    if args.min_magnitude_pct < 0:
        parser.error(f"--min-magnitude-pct = {args.min_magnitude_pct}: expected >= 0")
    out = args.out_dir or Path("results/history") / args.label
    try:
        page = write_page(args.archive_root, args.label, out, max_pvalue=args.max_pvalue,
                          min_magnitude_pct=args.min_magnitude_pct)  # fmt: skip
    except history.HistoryError as exc:
        print(f"cellbench history: error: {exc}", file=sys.stderr)
        return 2
    print(f"history of {args.label}: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
