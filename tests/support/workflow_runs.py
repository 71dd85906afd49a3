"""Dry runs and fresh copies of the workflow, for tests that plan or run it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def planned_jobs(*args: str, cwd: Path = ROOT) -> Counter:
    """Job counts by rule from a dry run (Snakemake's job-stats table)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", *args, "--quiet", "rules"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = Counter()
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"(\w+)\s+(\d+)", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def fresh_copy(tmp_path: Path) -> Path:
    """The workflow without the checkout's results/, so a plan or a run starts from nothing.
    Other test modules import this."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("Snakefile", "workflow", "config", "profiles"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, work / name)
    return work
