"""The history of one ROCm version: every archived run's per-point metrics as time series, and
their change points (Apache Otava).

One row per (run, cell, arm, point, metric): the median over the point's valid repeats, how
many repeats it had, the run's time (its measurement's start, else when it was archived), the
image digest the run served and the vLLM version each arm's server answered (``GET
/version``). A series is one (cell, arm, point, metric) over the runs, ordered by time. GSM8K's
strict-match per arm is one more series (point ``gsm8k``). Runs are read through the tidy
table (``cellbench.report.tidy``), so every file passes its check; a run whose files differ
from its manifest is left out and named.

Change points: ``otava.analysis.compute_change_points`` (E-divisive split, then Hunter's merge:
a point is kept when its t-test p-value is below ``max_pvalue`` and the shift is larger than
``min_magnitude``), one call per series. Each change point gets the run it starts at, its
p-value, the means before and after and the shift in percent.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cellbench.common import atomicio
from cellbench.contracts.result_file import ResultError
from cellbench.report import tidy as tidy_table
from cellbench.results.archived import check_run, read_manifest, runs
from cellbench.watch.verdict import METRICS

SERIES_KEYS = ["cell", "arm", "point", "metric"]
COLUMNS = [
    "label", "run", "time", "cell", "image", "arm", "point", "metric", "value", "repeats",
    "digest", "vllm_version",
]  # fmt: skip
GSM8K_METRIC = "strict_match"
OTAVA_WINDOW = 30  # runs per E-divisive window: a history here is shorter than one window


class HistoryError(RuntimeError):
    """A history that cannot be built (no archive for the label): one line."""


@dataclass
class History:
    label: str
    rows: pd.DataFrame
    left_out: list[str] = field(default_factory=list)  # "RUN: why"


def _point(row: pd.Series) -> str:
    text = f"{int(row['isl'])}-{int(row['osl'])}"
    return text + (f" c{int(row['concurrency'])}" if pd.notna(row["concurrency"]) else "")


def _run_time(manifest: dict) -> str:
    measured = manifest.get("measured") or {}
    return str(measured.get("start") or manifest.get("created") or "")


def run_rows(label: str, run_dir: Path, manifest: dict) -> pd.DataFrame:
    """One archived run's rows (see the module's docstring)."""
    frame = tidy_table.tidy(run_dir)
    serve = frame[(frame.stage == "serve") & frame.metric.isin(METRICS)].copy()
    serve["point"] = serve.apply(_point, axis=1) if len(serve) else []
    gsm = frame[(frame.stage == "gsm8k") & (frame.metric == GSM8K_METRIC)].copy()
    gsm["point"] = "gsm8k"
    both = pd.concat([serve, gsm], ignore_index=True)
    if not len(both):
        return pd.DataFrame(columns=COLUMNS)
    grouped = both.groupby(SERIES_KEYS + ["image", "digest"], dropna=False)["value"]
    out = grouped.agg(value="median", repeats="count").reset_index()
    versions = manifest.get("server_versions") or {}
    out["vllm_version"] = [
        (versions.get(cell) or {}).get(arm) for cell, arm in zip(out.cell, out.arm, strict=True)
    ]
    out["label"], out["run"], out["time"] = label, run_dir.name, _run_time(manifest)
    return out[COLUMNS]


def build(archive_root: Path, label: str) -> History:
    """Every archived run of ``label`` as rows, ordered by run time."""
    found = runs(Path(archive_root), label)
    if not found:
        raise HistoryError(f"no archived run under {Path(archive_root) / label}")
    frames, left_out = [], []
    for run in found:
        manifest = read_manifest(run.path)
        check = check_run(run.path)
        if manifest is None or not check.ok():
            left_out.append(f"{run.name}: fails its check (cellbench archive verify {run.ref})")
            continue
        try:
            frames.append(run_rows(label, run.path, manifest))
        except (ResultError, FileNotFoundError) as exc:
            left_out.append(f"{run.name}: {exc}")
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    rows = rows.sort_values(["time", "run", *SERIES_KEYS], kind="stable").reset_index(drop=True)
    rows["repeats"] = rows["repeats"].astype("Int64")
    rows["value"] = rows["value"].astype(float)
    return History(label, rows, left_out)


def series(rows: pd.DataFrame) -> Iterable[tuple[tuple, pd.DataFrame]]:
    """(cell, arm, point, metric) and its rows in time order."""
    for key, part in rows.groupby(SERIES_KEYS, sort=True):
        yield key, part.sort_values(["time", "run"], kind="stable")


def change_points(
    rows: pd.DataFrame, *, max_pvalue: float = 0.01, min_magnitude_pct: float = 0.0
) -> pd.DataFrame:
    """Otava's change points of every series: cell, arm, point, metric, the run the shift
    starts at (and the one before), p-value, means before and after, shift in percent."""
    from otava.analysis import compute_change_points

    found = []
    for (cell, arm, point, metric), part in series(rows):
        values = part["value"].tolist()
        if len(values) < 3:
            continue  # E-divisive needs points on both sides of a split
        cps, _ = compute_change_points(
            values,
            window_len=OTAVA_WINDOW,
            max_pvalue=max_pvalue,
            min_magnitude=min_magnitude_pct / 100.0,
        )
        runs_in_order = part["run"].tolist()
        for cp in cps:
            i = int(cp.index)
            found.append(
                {
                    "cell": cell, "arm": arm, "point": point, "metric": metric,
                    "index": i, "run": runs_in_order[i], "run_before": runs_in_order[i - 1],
                    "pvalue": float(cp.stats.pvalue),
                    "mean_before": float(cp.stats.mean_1),
                    "mean_after": float(cp.stats.mean_2),
                    "shift_pct": float(cp.stats.forward_change_percent()),
                }
            )  # fmt: skip
    columns = ["cell", "arm", "point", "metric", "index", "run", "run_before", "pvalue",
               "mean_before", "mean_after", "shift_pct"]  # fmt: skip
    return pd.DataFrame(found, columns=columns)


def write_tables(history: History, points: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``history.csv``, ``history.parquet`` and ``change_points.csv`` in ``out_dir``, each
    written atomically."""
    out_dir = Path(out_dir)
    buffer = io.BytesIO()
    history.rows.to_parquet(buffer, index=False)
    atomicio.write_bytes(out_dir / "history.parquet", buffer.getvalue())
    atomicio.write_text(out_dir / "history.csv", history.rows.to_csv(index=False))
    atomicio.write_text(out_dir / "change_points.csv", points.to_csv(index=False))
    return [out_dir / n for n in ("history.csv", "history.parquet", "change_points.csv")]
