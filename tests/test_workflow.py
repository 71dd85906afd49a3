"""The workflow's DAG as `snakemake -n` plans it, without Docker or a GPU."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_production_dry_run_lists_every_job(tmp_path):
    # No lock file and no engine: the plan is still complete (pins are checked when a job runs).
    jobs = planned_jobs("all", "--configfile", str(ROOT / "config/config.yaml"))
    cells, arms = 4, 2
    assert jobs == Counter(
        {
            "tune": cells,
            "serve": cells * arms,
            "gsm8k": cells * arms,
            "report": 1,
            "archive": 2,
            "all": 1,
        }
    )


def test_embedded_default_dry_run():
    jobs = planned_jobs("all")  # the default workflow profile selects config/local.yaml
    assert jobs["tiny_model"] == 1 and jobs["gsm8k_set"] == 1
    assert jobs["tune"] == 2 and jobs["serve"] == 4 and jobs["gsm8k"] == 4
    assert jobs["report"] == 1 and jobs["archive"] == 1


def test_one_cell_is_one_target():
    target = "results/rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2/gsm8k/tuned.json"
    jobs = planned_jobs(target, "--configfile", str(ROOT / "config/config.yaml"))
    assert jobs == Counter({"tune": 1, "serve": 1, "gsm8k": 1})
