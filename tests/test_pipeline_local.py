"""The whole DAG end to end on the embedded default: tune -> serve -> GSM8K -> report -> archive.

Runs the real workflow (real Triton under the interpreter, a real `transformers serve`, real
lm-eval) in a copy of the project, so the checkout's results/ is left alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from cellbench import archive
from test_workflow import fresh_copy

ROOT = Path(__file__).resolve().parents[1]
CELLS = ["host-cpu/tiny-qwen3-moe/tp1-ep1", "host-cpu/tiny-qwen3-moe/tp2-ep2"]


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    work = fresh_copy(tmp_path_factory.mktemp("pipeline"))
    proc = snakemake(work, "all")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return work


@pytest.mark.slow
def test_every_stage_wrote_its_outputs(finished_run):
    res = finished_run / "results"
    bench_schema = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
    gsm_schema = json.loads((ROOT / "workflow/schemas/gsm8k.schema.json").read_text())
    for cell in CELLS:
        tune = json.loads((res / cell / "tune/summary.json").read_text())
        configs = list((res / cell / "tune/configs").glob("*.json"))
        assert [c.name for c in configs] == [tune["config_file"]]
        assert "device_name=CPU_TRITON_INTERPRET" in tune["config_file"]
        vllm_json = json.loads(configs[0].read_text())
        assert sorted(int(k) for k in vllm_json if k != "triton_version") == [1, 4, 16]
        for arm in ("untuned", "tuned"):
            bench = json.loads((res / cell / f"serve/{arm}/bench.json").read_text())
            jsonschema.validate(bench, bench_schema)
            assert len(bench["points"]) == 2 * 3  # grid points x repeats
            for point in bench["points"]:
                assert point["completed"] > 0 and point["failed"] == 0
                assert point["mean_ttft_ms"] > 0 and point["output_throughput"] > 0
            assert bench["interleaved"] is True
            assert bench["arm_order"] == [
                ["untuned", "tuned"],
                ["tuned", "untuned"],
                ["untuned", "tuned"],
            ]
            gsm = json.loads((res / cell / f"gsm8k/{arm}.json").read_text())
            jsonschema.validate(gsm, gsm_schema)
            assert gsm["n_samples"] == 8
            assert (res / cell / f"serve/{arm}/server.log").stat().st_size > 0


@pytest.mark.slow
def test_arms_were_interleaved(finished_run):
    # One serve_pair job per cell: its points of both arms, in the order they were measured.
    for cell in CELLS:
        points = sorted(
            (p["seq"], arm, p["repeat"], p["started_at"])
            for arm in ("untuned", "tuned")
            for p in json.loads(
                (finished_run / "results" / cell / f"serve/{arm}/bench.json").read_text()
            )["points"]
        )
        assert [seq for seq, *_ in points] == list(range(12))
        # 2 grid points per arm and repeat: A A B B, then B B A A, then A A B B.
        a, b = ["untuned"] * 2, ["tuned"] * 2
        assert [arm for _, arm, _, _ in points] == a + b + b + a + a + b
        assert [rep for _, _, rep, _ in points] == [0] * 4 + [1] * 4 + [2] * 4
        starts = [start for *_, start in points]
        assert starts == sorted(starts)


@pytest.mark.slow
def test_report_and_archive(finished_run):
    res = finished_run / "results"
    text = (res / "report/report.md").read_text()
    assert "Embedded default" in text
    for cell in CELLS:
        assert f"## {cell}" in text
    assert text.count("#### TTFT (ms)") == 2 and "| Average" in text
    assert "exact_match, strict-match" in text
    manifest = res / "archive/embedded-cpu/MANIFEST.json"
    data = json.loads(manifest.read_text())
    assert data["cells"] == CELLS and data["git"] and data["config_sha256"]
    assert archive.verify(manifest) == []


@pytest.mark.slow
def test_nothing_left_to_do_and_one_cell_reruns_alone(finished_run):
    proc = snakemake(finished_run, "-n", "all")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr
    # A new version of the in-container tuner code (a rule parameter) reruns every tune and
    # what reads its configs: the pair jobs, which measure the untuned arm again alongside.
    config = finished_run / "config/local.yaml"
    original = config.read_text()
    config.write_text(original.replace("tune:\n", "tune:\n  code_version: '2'\n", 1))
    try:
        proc = snakemake(finished_run, "-n", "all", "--quiet", "rules")
    finally:
        config.write_text(original)
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))
    jobs.pop("total", None)
    assert jobs == {
        "tune": "2",
        "serve_pair": "2",
        "gsm8k": "4",
        "report": "1",
        "archive": "1",
        "all": "1",
    }, proc.stdout + proc.stderr
