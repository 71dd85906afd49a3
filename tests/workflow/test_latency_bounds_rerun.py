"""report.latency_bounds through real Snakemake (issue 32 item 5): turning bounds on reruns the
report job alone, and the bounds reach the report's command line intact, so its section is
built from the cells' per-request files. The cells are hand-made results (with their
per-request files); only the report, gate and plots rules run (--allowed-rules), as in
tests/workflow/test_results.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import result_fixtures as fx
from support.workflow_runs import fresh_copy

INDEX = "results/report/embedded-cpu/INDEX.json"


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *args, "--", INDEX],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _planned(work: Path) -> dict[str, int]:
    out = _snakemake(work, "-n", "--quiet", "rules").stdout
    jobs = {r: int(n) for r, n in re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M)}
    jobs.pop("total", None)
    return jobs


@pytest.mark.slow
def test_bounds_rerun_the_report_alone_and_reach_its_section(tmp_path):
    work = fresh_copy(tmp_path)
    res = work / "results"
    for model in ("tiny-qwen3-moe", "tiny-qwen3-moe-16e"):  # config/local.yaml's two cells
        cell = f"host-cpu/{model}/tp1-ep1"
        fx.write_tune(res, cell)
        for arm in ("untuned", "tuned"):
            points = [fx.point(512, 512, repeat=r, seq=r) for r in range(2)]  # 160 prompts each
            fx.write_requests(fx.write_bench(res, cell, arm, points), ttft_s=0.05)
            fx.write_gsm8k(res, cell, arm, [True, False, True, True])
    _snakemake(work, "--allowed-rules", "report", "gate", "plots")
    assert "Latency bounds" not in (res / "report/embedded-cpu/report.md").read_text()
    assert _planned(work) == {}  # finished: nothing to do

    config_path = work / "config/local.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["report"] = {"latency_bounds": {"ttft_ms": 100}}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert _planned(work) == {"report": 1}  # not the gates, not the plots

    _snakemake(work, "--allowed-rules", "report")
    text = (res / "report/embedded-cpu/report.md").read_text()
    section = text.split("#### Latency bounds: p99 at 99% confidence")[1].split("\n####")[0]
    # 2 repeats x 160 requests, every first token at 50 ms: none over, too few to tell
    row = "| 512-512 | c16 | Triton MoE Untuned | TTFT | 100 | 50.00 | 320 | 0 | cannot tell | 459"
    assert row in section, section
    assert (res / "report/embedded-cpu/percentile_claims.csv").is_file()
    assert _planned(work) == {}
