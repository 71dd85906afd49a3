"""What each job of a cell took, as Snakemake measured it, and the plan's estimate file.

Every rule has a ``benchmark:`` file (``results/benchmarks/<cell>/<job>.tsv``, Snakemake's own
wall clock of the job in column ``s``). The plan-time estimate (``cellbench plan --write``,
which the workflow's start runs) is ``results/plan/{run_label}/estimate.json``, one per config.
Both are read here: the plan reads the last run's times as history, the report sets estimate
against actual. An archived run keeps its cells' files of ``KIND_FILES`` at the same place
under its folder (``benchmarks/<cell>/``), so the plan can read them there when ``results/``
has none.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path


def estimate_file(run_label: str) -> Path:
    """Where a config's estimate lies under the results folder: one folder per run label, so
    one config's run never replaces the estimate another's report reads."""
    return Path("plan") / run_label / "estimate.json"


BENCHMARKS = "benchmarks"  # the benchmark files' folder under a results folder or archived run
ESTIMATE_KIND = "cost_estimate"
# A job kind and the benchmark files of its jobs in one cell (serve: the interleaved pair, or
# one job per arm; gsm8k: one summary job per arm).
KIND_FILES = {
    "tune": ("tune.tsv",),
    "serve": ("serve-pair.tsv", "serve-untuned.tsv", "serve-tuned.tsv"),
    "gsm8k": ("gsm8k-untuned.tsv", "gsm8k-tuned.tsv"),
}


class JobTimeError(Exception):
    """A benchmark or estimate file that cannot be read as one."""


@dataclass(frozen=True)
class JobTime:
    kind: str
    seconds: float
    files: tuple[str, ...]  # the benchmark files summed, relative to the results folder
    mtime: float  # the newest of them (a job not rerun keeps its file and its time)


def read_benchmark_seconds(path: Path) -> float:
    """Snakemake's wall clock of one job (column ``s`` of its benchmark file; with
    ``--benchmark-repeats`` one row per repeat: their sum)."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            raise ValueError("no row: the job's wall was never written")
        return sum(float(r["s"]) for r in rows)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise JobTimeError(f"{path}: not a Snakemake benchmark file ({exc})") from exc


def benchmark_files(results: Path, cell: str) -> list[Path]:
    """The benchmark files of ``cell``'s jobs that the estimate reads (``KIND_FILES``), those
    present under ``results`` (a results folder or an archived run, which keeps them)."""
    folder = Path(results) / BENCHMARKS / cell
    return [folder / n for names in KIND_FILES.values() for n in names if (folder / n).is_file()]


def cell_job_times(results: Path, cell: str) -> dict[str, JobTime]:
    """Per job kind, the measured wall of the cell's last jobs of that kind (kinds whose jobs
    never ran are absent). ``results`` is a results folder or an archived run."""
    folder = Path(results) / BENCHMARKS / cell
    out = {}
    for kind, names in KIND_FILES.items():
        found = [folder / n for n in names if (folder / n).is_file()]
        if found:
            out[kind] = JobTime(
                kind,
                sum(read_benchmark_seconds(p) for p in found),
                tuple(str(p.relative_to(results)) for p in found),
                max(p.stat().st_mtime for p in found),
            )
    return out


def read_estimate(results: Path, run_label: str) -> dict | None:
    """The plan's estimate file of a run label, checked; None when there is none."""
    path = Path(results) / estimate_file(run_label)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise JobTimeError(f"{path}: unreadable estimate ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != ESTIMATE_KIND:
        raise JobTimeError(f"{path}: not a cellbench cost estimate (kind {ESTIMATE_KIND!r})")
    cells = data.get("cells")

    def jobs_ok(jobs: object) -> bool:
        return isinstance(jobs, dict) and all(
            isinstance(j, dict) and isinstance(j.get("seconds"), int | float) for j in jobs.values()
        )

    if not isinstance(cells, dict) or not all(jobs_ok(jobs) for jobs in cells.values()):
        raise JobTimeError(f"{path}: 'cells' must map each cell to jobs with 'seconds'")
    return data
