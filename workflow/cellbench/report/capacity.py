"""Capacity at the SLA in the report (``serve.sla``; what a result means is
``cellbench.contracts.capacity``).

Per cell and searched grid point: a headline ("tuned sustains 24 concurrent requests at p90
TPOT <= 50 ms, untuned 16 (+50%, better)") with each arm's goodput at its capacity, or, where
no probed load met the bounds, what the smallest load gave; a table of both arms' boundaries
with the verdict on their difference; and a latency-against-load figure with the bound drawn
and both arms' boundaries marked. ``capacity.csv`` holds one row per cell, point and arm.

One search per arm gives one boundary per arm and no repeat to measure its spread: the verdict
calls a difference only where the two brackets [capacity, first fail) do not overlap, and
otherwise says what the search could have seen (its resolution), never a noise it did not
measure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd

from cellbench.common import atomicio
from cellbench.contracts import capacity as search
from cellbench.contracts import result_file
from cellbench.contracts.result_file import Result

CSV_NAME = "capacity.csv"
FOLDER = "capacity"  # the figures, under the report folder: capacity/CELL/ISL-OSL.png
ARMS = ("untuned", "tuned")
NOTE = (
    "One search per arm: one boundary each, with no repeat to measure its spread. A "
    "difference is called only where the arms' brackets (last pass, first fail) do not "
    "overlap; below the search's resolution the verdict is inconclusive and says the smallest "
    "change it could have seen."
)

SAME_CODE_NOTE = (
    "Not compared: neither arm's server ran a Triton fused-MoE kernel, so the arms ran the same "
    "code; any gap between their capacities is the search's own spread, and no verdict is given."
)


def by_cell(loaded: Iterable[Result]) -> dict[str, dict[tuple[int, int], dict[str, Any]]]:
    """cell -> (isl, osl) -> arm -> (the arm's capacity settings, the point's entry)."""
    out: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for r in loaded:
        if r.kind != result_file.BENCH or "capacity" not in r.data:
            continue
        section = r.data["capacity"]
        for entry in section["points"]:
            point = out.setdefault(r.data["cell"], {}).setdefault((entry["isl"], entry["osl"]), {})
            point[r.data["arm"]] = (section, entry)
    return out


def _at_capacity(entry: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The probe at the arm's capacity (its last passing load), if any."""
    probes = [p for p in entry["probes"] if p["concurrency"] == entry["capacity"] and p["passed"]]
    return probes[-1] if probes else None


def _pct(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return "from none" if math.isinf(x) else f"{x:+.0f}%"


def _goodput(arm: str, entry: Mapping[str, Any]) -> str | None:
    probe = _at_capacity(entry)
    if probe is None:
        return None
    return (
        f"{arm} {probe['request_goodput']:.2f} req/s within the SLA "
        f"({probe['output_throughput']:.1f} output tok/s) at {probe['concurrency']}"
    )


def headline(point: Mapping[str, Any], min_change_pct: float, compared: bool = True) -> list[str]:
    """A point's headline lines: both arms' capacities and the verdict, with goodput at that
    load; an arm that met no load says what its smallest load gave. ``compared`` False: the
    arms ran the same code, each arm's result alone and no verdict."""
    arms = [a for a in ARMS if a in point]
    sla, _ = point[arms[0]]
    first = point[arms[0]][1]
    text = search.sla_text(first["bounds_ms"], sla["percentile"])
    if not compared:
        lines = [f"{a}: {search.headline_side(point[a][1], sla)}." for a in arms]
    elif len(arms) == 2 and all(point[a][1]["capacity"] > 0 for a in arms):
        untuned, tuned = point["untuned"][1], point["tuned"][1]
        row = search.compare(untuned, tuned, min_change_pct)
        line = (
            f"tuned sustains {search.requests(tuned['capacity'])} at {text}, untuned "
            f"{untuned['capacity']} ({_pct(row['change_pct'])}, {search.verdict_text(row)})"
        )
        lines = [line + "."]
        lines += [
            f"{a}: {search.headline_side(point[a][1], sla)}."
            for a in arms
            if point[a][1]["status"] != search.FOUND
        ]
    else:
        lines = [f"{a}: {search.headline_side(point[a][1], sla)}." for a in arms]
        if len(arms) == 2:
            row = search.compare(point["untuned"][1], point["tuned"][1], min_change_pct)
            lines.append(f"Verdict: {search.verdict_text(row)} ({row['why']}).")
    good = [g for a in arms if (g := _goodput(a, point[a][1])) is not None]
    if good:
        lines.append("Goodput at that load: " + "; ".join(good) + ".")
    return lines


def frame(loaded: Iterable[Result], min_change_pct: float) -> pd.DataFrame:
    """capacity.csv: one row per cell, searched point and arm, with the verdict of the point
    on both arms' rows."""
    rows = []
    for cell, points in sorted(by_cell(loaded).items()):
        for (isl, osl), point in sorted(points.items()):
            row = {}
            if {"untuned", "tuned"} <= set(point):
                row = search.compare(point["untuned"][1], point["tuned"][1], min_change_pct)
            for arm, (sla, entry) in sorted(point.items()):
                probe = _at_capacity(entry)
                rows.append(
                    {
                        "cell": cell,
                        "isl": isl,
                        "osl": osl,
                        "arm": arm,
                        "percentile": sla["percentile"],
                        "sla": search.sla_text(entry["bounds_ms"], sla["percentile"]),
                        "capacity": entry["capacity"],
                        "first_fail": entry["first_fail"],
                        "status": entry["status"],
                        "non_monotone": entry["non_monotone"],
                        "probes": len(entry["probes"]),
                        "request_goodput": probe["request_goodput"] if probe else math.nan,
                        "output_throughput": probe["output_throughput"] if probe else math.nan,
                        "change_pct": row.get("change_pct", math.nan),
                        "verdict": search.verdict_text(row) if row else "n/a",
                        "could_see_pct": row.get("could_see_pct", math.nan),
                    }
                )
    return pd.DataFrame(rows)


def figure_rel(cell: str, isl: int, osl: int) -> PurePosixPath:
    """A point's figure (PNG; the SVG beside it) relative to the report folder."""
    return PurePosixPath(FOLDER, cell, f"{isl}-{osl}.png")


def section_lines(
    loaded: Iterable[Result],
    cell: str,
    min_change_pct: float,
    link_prefix: str = "",
    same_code: bool = False,
) -> list[str]:
    """report.md's (and the PR file's) capacity section of one cell; nothing without a search.
    ``link_prefix``: where the report folder lies from the file (``../`` from pr/);
    ``same_code``: neither arm ran a Triton fused-MoE kernel (``frames.arms_cannot_differ``),
    so each arm's capacity is shown and no verdict given."""
    points = by_cell(loaded).get(cell)
    if not points:
        return []
    lines = ["#### Capacity at the SLA", ""]
    for (isl, osl), point in sorted(points.items()):
        words = headline(point, min_change_pct, compared=not same_code)
        lines += [f"ISL-OSL {isl}-{osl}: " + " ".join(words), ""]
        lines += [f"![capacity {isl}-{osl}]({link_prefix}{figure_rel(cell, isl, osl)})", ""]
    return [*lines, SAME_CODE_NOTE if same_code else NOTE, ""]


def draw_all(loaded: Iterable[Result], out_dir: Path) -> list[Path]:
    """Every searched point's figure under ``out_dir/capacity``; the files written."""
    written = []
    for cell, points in sorted(by_cell(loaded).items()):
        for (isl, osl), point in sorted(points.items()):
            stem = out_dir / figure_rel(cell, isl, osl).with_suffix("")
            stem.parent.mkdir(parents=True, exist_ok=True)
            written += draw_point(point, f"{cell} {isl}-{osl}", stem)
    return written


def write(loaded: list[Result], out_dir: Path, min_change_pct: float) -> list[Path]:
    """capacity.csv and the figures, where any arm ran a search; the files written."""
    table = frame(loaded, min_change_pct)
    if not len(table):
        return []
    path = out_dir / CSV_NAME
    atomicio.write_text(path, table.to_csv(index=False))
    return [path, *draw_all(loaded, out_dir)]


def draw_point(point: Mapping[str, Any], title: str, stem: Path) -> list[Path]:
    """One point's figure (both arms) as PNG and SVG at ``stem``: each bounded metric's
    percentile against concurrency per arm (a marker per probe), the bound as a horizontal
    line, each arm's capacity as a dashed vertical line in its colour."""
    from cellbench.report.plots import ARM_COLORS, plt, save_figure  # matplotlib only here

    arms = [a for a in ("untuned", "tuned") if a in point]
    sla, first = point[arms[0]]
    metrics = [m for m in search.METRICS if m in first["bounds_ms"]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4.4), squeeze=False)
    loads = sorted({p["concurrency"] for a in arms for p in point[a][1]["probes"]})
    for ax, metric in zip(axes[0], metrics, strict=True):
        bound = first["bounds_ms"][metric]
        for arm in arms:
            entry = point[arm][1]
            probes = sorted(entry["probes"], key=lambda p: p["concurrency"])
            xs = [p["concurrency"] for p in probes if p["values_ms"][metric] is not None]
            ys = [p["values_ms"][metric] for p in probes if p["values_ms"][metric] is not None]
            color = ARM_COLORS.get(arm, "#000000")
            ax.plot(xs, ys, marker="o", color=color, label=f"{arm}: capacity {entry['capacity']}")
            if entry["capacity"] > 0:
                ax.axvline(entry["capacity"], color=color, linestyle="--", linewidth=1)
        ax.axhline(bound, color="#d62728", linewidth=1, label=f"bound {bound:g} ms")
        ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [str(c) for c in loads])  # the probed loads, as numbers
        ax.minorticks_off()
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(f"p{sla['percentile']:g} {metric.upper()} (ms)")
        ax.legend(fontsize="small")
    text = search.sla_text(first["bounds_ms"], sla["percentile"])
    fig.suptitle(f"{title}\nlatency against load, {text}", fontsize="medium")
    fig.tight_layout()
    return save_figure(fig, stem)
