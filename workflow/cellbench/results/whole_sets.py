"""Whole sets of stage results: a table over cells is whole only when every cell has all five
of its stage results (``check_whole``, ``check_whole_files``; ``IncompleteResults`` names every
one missing).

Split out of ``cellbench.results.loaders``: it checks which files exist, not
what one holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cellbench.contracts.result_file import ResultError

# A table over cells is whole only when every cell has all five of its stage results: a set
# with one missing would be read as a smaller experiment, not as a broken one.
CELL_STAGE_FILES = (
    "tune/summary.json",
    "serve/untuned/bench.json",
    "serve/tuned/bench.json",
    "gsm8k/untuned.json",
    "gsm8k/tuned.json",
)
LIVE_REBUILD = "snakemake all --cores 2 (with your --configfile, if any)"


class IncompleteResults(ResultError):
    """Stage results a whole-run table needs are missing; the message names every one."""

    def __init__(self, root: Path | str, missing: list[str], rebuild: str):
        Exception.__init__(
            self,
            f"incomplete results in {root}: {len(missing)} stage result(s) missing: "
            f"{', '.join(missing)}; every cell needs {', '.join(CELL_STAGE_FILES)}; "
            f"rebuild them: {rebuild}",
        )
        self.path, self.field, self.value = str(root), "(cells)", missing
        self.expected, self.rerun = "every cell's stage results", rebuild


def cell_of(path: Path | str, results: Path | str | None = None) -> str | None:
    """The IMAGE/MODEL/tpN-epM cell a per-cell stage result belongs to (None otherwise)."""
    path = Path(path)
    for rel in CELL_STAGE_FILES:
        depth = len(Path(rel).parts)
        if path.parts[-depth:] == Path(rel).parts and len(path.parts) >= depth + 3:
            return "/".join(path.parts[-depth - 3 : -depth])
    return None


def missing_stage_files(root: Path | str, cells: Iterable[str]) -> list[str]:
    """Of ``cells``' stage results under ``root``, those that are not files, as paths."""
    root = Path(root)
    return [
        str(root / cell / rel)
        for cell in sorted(set(cells))
        for rel in CELL_STAGE_FILES
        if not (root / cell / rel).is_file()
    ]


def check_whole(root: Path | str, cells: Iterable[str], rebuild: str = LIVE_REBUILD) -> None:
    """Raise ``IncompleteResults`` unless every cell has each of its stage results."""
    missing = missing_stage_files(root, cells)
    if missing:
        raise IncompleteResults(root, missing, rebuild)


def check_whole_files(files: Iterable[Path | str], rebuild: str = LIVE_REBUILD) -> None:
    """Like ``check_whole`` for a list of files (a job's inputs): every cell that one of them
    belongs to must have all of its stage results among them, each an existing file."""
    given: dict[str, dict[str, Path]] = {}
    for f in map(Path, files):
        cell = cell_of(f)
        if cell is not None:
            cell_dir = Path(*f.parts[: len(f.parts) - len(Path(_rel_of(f)).parts)])
            given.setdefault(cell, {"(dir)": cell_dir})[_rel_of(f)] = f
    missing = []
    for _cell, found in sorted(given.items()):
        for rel in CELL_STAGE_FILES:
            path = found.get(rel, found["(dir)"] / rel)
            if rel not in found or not path.is_file():
                missing.append(str(path))
    if missing:
        root = os.path.commonpath([str(given[c]["(dir)"]) for c in given]) if given else "."
        raise IncompleteResults(root, missing, rebuild)


def _rel_of(path: Path) -> str:
    return next(r for r in CELL_STAGE_FILES if path.parts[-len(Path(r).parts) :] == Path(r).parts)
