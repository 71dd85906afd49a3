"""benchmarks/tuner_vllm_kernel_h200.py (issue 23): its CPU smoke mode runs the whole script
(default and exhaustive tuner runs on vLLM's kernel from its sources, the side-by-side re-time
against the builtin kernel) on a tiny shape under the interpreter, and it refuses bad input
before any work. The smoke's numbers are interpreter timings: only their presence is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "tuner_vllm_kernel_h200.py"
SRC = Path(os.environ.get("CELLBENCH_VLLM_SOURCE") or ROOT / ".vllm-src" / "vllm-0.34.0")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    env.pop("CELLBENCH_VLLM_SOURCE", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)  # fmt: skip


def test_bad_input_is_refused_before_any_work(tmp_path) -> None:
    p = _run("--smoke", "--dtypes", "fp4", "--out", str(tmp_path / "a"))
    assert p.returncode == 2 and "--dtypes='fp4'" in p.stderr
    p = _run("--smoke", "--vllm-source", str(tmp_path / "none"), "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "none does not exist" in p.stderr
    assert "vllm-kernel-src.sh" in p.stderr
    assert not list((tmp_path / "a").iterdir()) and not list((tmp_path / "b").iterdir())


@pytest.mark.slow
def test_smoke_writes_the_side_by_side_tables(tmp_path) -> None:
    if not (SRC / "SOURCE.json").is_file():
        pytest.skip(f"vLLM's kernel sources absent at {SRC} (workflow/scripts/vllm-kernel-src.sh)")
    out = tmp_path / "out"
    p = _run("--smoke", "--batch-sizes", "1", "--exhaustive-ms", "1", "--vllm-source", str(SRC),
             "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    res = json.loads((out / "tuner_vllm_kernel_h200_bf16.json").read_text())
    meta = res["meta"]
    for key in ("date", "device", "torch", "triton", "python"):
        assert meta[key]
    assert (
        meta["vllm_source"]["version"] == json.loads((SRC / "SOURCE.json").read_text())["version"]
    )
    assert meta["stage_reached"] == "exhaustive compared"
    assert "fused_moe_kernel" in res["vllm_kernel"]["vllm_parts"]
    for mode in ("default", "exhaustive"):
        assert res[mode]["backend"] == "vllm" and res[mode]["complete"]
        assert set(res[mode]["seconds"]) >= {"wall", "cpu", "gpu"}
    sbs = res["side_by_side"]["1"]
    for label in ("vllm:default", "vllm:shipped", "vllm:exhaustive", "builtin:default",
                  "builtin:shipped"):  # fmt: skip
        assert sbs[label]["call_us"] > 0 and sbs[label]["gemms_us"] > 0, label
        assert sbs[label]["error"] < 1.5e-2
    r = sbs["ratios"]["builtin/vllm:shipped:call"]
    assert r == pytest.approx(sbs["builtin:shipped"]["call_us"] / sbs["vllm:shipped"]["call_us"])
    txt = (out / "tuner_vllm_kernel_h200_bf16.txt").read_text()
    assert "exhaustive ran at M=1 only" in txt and "date: " in txt
