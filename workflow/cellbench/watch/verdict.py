"""The one place this package calls the pipeline's verdict: two sides' serve rows in, one
verdict per grid point and metric out. Everything here (bisect steps, the watch summary) goes
through ``compare``, so repointing the verdict means editing this file alone."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from cellbench.stats import comparison

WORSE, BETTER = "worse", "better"
METRICS = tuple(comparison.METRICS)


def compare(
    good: pd.DataFrame,
    candidate: pd.DataFrame,
    *,
    min_change_pct: float,
    metrics: Iterable[str] = METRICS,
) -> list[dict]:
    """Per grid point and metric both sides hold: the verdict of ``candidate`` (B) against
    ``good`` (A), as the report calls it (``point``, ``metric``, ``verdict``, ``change_pct``,
    ``p_adj`` (the table-adjusted p-value) and ``mdc_pct`` (the smallest change the row could
    have seen) where the test gives them, and the starts and repeats behind each side)."""
    wanted = set(metrics)
    rows = comparison.compare_serve(good, candidate, min_change_pct=min_change_pct)
    out = []
    for row in rows:
        if row["metric"] not in wanted:
            continue
        point = f"{row['isl']}-{row['osl']}"
        if row.get("max_concurrency") is not None:
            point += f" c{row['max_concurrency']}"
        out.append(
            {
                "point": point,
                "metric": row["metric"],
                "verdict": str(row.get("verdict", "n/a")),
                "change_pct": _float(row.get("change_pct")),
                "p_adj": _float(row.get("p_adj")),
                "mdc_pct": _float(row.get("mdc_pct")),
                "starts_good": int(row.get("starts_a", 0) or 0),
                "starts_candidate": int(row.get("starts_b", 0) or 0),
                "n_good": int(row.get("repeats_a", 0) or 0),
                "n_candidate": int(row.get("repeats_b", 0) or 0),
            }
        )
    return out


def worse(rows: Iterable[dict]) -> list[dict]:
    """The rows the verdict calls worse."""
    return [r for r in rows if r["verdict"] == WORSE]


def _float(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if out != out else out


def against_previous(
    archive_root: Path, results: Path, cell: str, *, min_change_pct: float
) -> tuple[str | None, list[dict]]:
    """The cell's results now (B) against its previous archived run with other results (A),
    per arm: (that run's ref or None, rows as ``compare`` gives them, each with its ``arm``)."""
    from cellbench.report.previous import frames_of
    from cellbench.results.archived import previous_run

    run = previous_run(archive_root, results, cell)
    if run is None:
        return None, []
    now, _, _ = frames_of(Path(results), [cell])
    before, _, _ = frames_of(run.path, [cell])
    rows = []
    for arm in sorted(set(now.get("arm", [])) & set(before.get("arm", []))):
        for row in compare(
            before[before.arm == arm], now[now.arm == arm], min_change_pct=min_change_pct
        ):
            rows.append({**row, "arm": arm})
    return run.ref, rows
