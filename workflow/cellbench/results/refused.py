"""Which of a run's stage results are present but would be refused by their readers: the
workflow plans their jobs again (``workflow/rules/common.smk`` forces them), so a damaged
result is rebuilt like a missing one, once.

A result file goes through its loader (``cellbench.results.loaders``: whole JSON, its recorded
checksum, its schema and invariants); lm-eval's folder ``serve/{arm}/lm_eval`` through the
checksum the serve job recorded of every file in it (``atomicio.tree_problem``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cellbench.common import atomicio
from cellbench.results import loaders

LM_EVAL = "lm_eval"


def problem(path: Path | str, results: Path | str = "results") -> str | None:
    """Why a reader would refuse ``path`` (a stage result or an lm-eval folder), or None when it
    is whole or absent (an absent result is planned by Snakemake itself)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.name == LM_EVAL:
        if not path.is_dir():
            return f"{path}: a folder of lm-eval's output expected"
        why = atomicio.tree_problem(path)
        return None if why is None else f"{path}: {why}"
    try:
        loaders.load(path, results)
    except loaders.ResultError as exc:
        return str(exc)
    return None


def refused(paths: Iterable[Path | str], results: Path | str = "results") -> list[tuple[str, str]]:
    """(path, the refusal) of each of ``paths`` that is present and would be refused."""
    out = []
    for path in paths:
        why = problem(path, results)
        if why is not None:
            out.append((str(path), why))
    return out
