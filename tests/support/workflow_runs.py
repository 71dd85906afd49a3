"""Dry runs and fresh copies of the workflow, for tests that plan or run it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


JOB_RE = re.compile(r"^(?:local)?rule (\S+):$")


def planned(*args: str, cwd: Path = ROOT) -> list[tuple[str, str]]:
    """(rule, its outputs as the dry run prints them; "" for none) of every job a dry run
    plans, in its order. The one reader of a dry run's plan: job counts come from it too."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs, rule = [], None
    for line in (proc.stdout + proc.stderr).splitlines():
        m = JOB_RE.match(line)
        if m:
            rule = m.group(1)
            jobs.append((rule, ""))
        elif rule and line.strip().startswith("output: "):
            jobs[-1] = (rule, line.strip().removeprefix("output: "))
            rule = None
    return jobs


def planned_jobs(*args: str, cwd: Path = ROOT) -> Counter:
    """Job counts by rule from a dry run."""
    return Counter(rule for rule, _ in planned(*args, cwd=cwd))


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
