"""benchmarks/builtin_vs_vllm_kernel_speed.py (issue 23, item 3): its CPU smoke runs the whole
script
(vLLM's kernel from its sources beside every builtin variant, output checks, interleaved
timing, tables) on a tiny shape under the interpreter, and it refuses bad input before any
work. The smoke's times are interpreter timings: only their presence is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "builtin_vs_vllm_kernel_speed.py"
SRC = Path(os.environ.get("CELLBENCH_VLLM_SOURCE") or ROOT / ".vllm-src" / "vllm-0.34.0")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow"), "TRITON_INTERPRET": "1"}
    env.pop("CELLBENCH_VLLM_SOURCE", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)  # fmt: skip


def test_bad_input_is_refused_before_any_work(tmp_path) -> None:
    p = _run("--smoke", "--dtypes", "fp4", "--out", str(tmp_path / "a"))
    assert p.returncode == 2 and "--dtypes='fp4'" in p.stderr
    p = _run("--smoke", "--batch-sizes", "1,x", "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "--batch-sizes='1,x'" in p.stderr
    p = _run("--smoke", "--vllm-source", str(tmp_path / "none"), "--out", str(tmp_path / "c"))
    assert p.returncode == 2 and "vllm-kernel-src.sh" in p.stderr
    assert not any((tmp_path / x).exists() for x in "abc")


@pytest.mark.skipif(not (SRC / "SOURCE.json").is_file(), reason=f"no vLLM sources at {SRC}")
def test_smoke_times_every_variant_beside_vllm(tmp_path) -> None:
    # --gpu names the outputs (issue 31: the GPU model is an argument, not in the script).
    p = _run("--smoke", "--batch-sizes", "1,8", "--gpu", "h100", "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert sorted(f.name for f in tmp_path.glob("builtin_vs_vllm_*")) == [
        "builtin_vs_vllm_h100_bf16.json",
        "builtin_vs_vllm_h100_bf16.txt",
    ]
    d = json.loads((tmp_path / "builtin_vs_vllm_h100_bf16.json").read_text())
    sbs = d["side_by_side"]
    assert set(sbs) == {"1", "8"} and d["not_timed"] == []
    want = {"1": {"vllm", "new", "old", "decode", "swap"}, "8": {"vllm", "new", "old", "swap"}}
    for m, names in want.items():
        assert set(sbs[m]) - {"config", "default_path", "default_choices", "wall_s"} == names
        for name in names:
            r = sbs[m][name]
            assert "failed" not in r, (m, name, r)
            assert r["error"] < 1.5e-2 and r["call_us"] > 0 and r["gemms_us"] > 0
            if name != "vllm":
                assert r["call_ratio"] == pytest.approx(r["call_us"] / sbs[m]["vllm"]["call_us"])
    # the default's choices are reported: naive assignment where pairs * 4 <= experts
    assert sbs["1"]["default_choices"]["naive"] is True
    assert sbs["8"]["default_choices"]["naive"] is False
    assert sbs["1"]["default_path"] == "grouped"
    txt = (tmp_path / "builtin_vs_vllm_h100_bf16.txt").read_text()
    assert "builtin kernel / vLLM 0.34 kernel" in txt and "default (new) whole call" in txt


_WARM = """
import sys
sys.path[:0] = ["benchmarks", "workflow"]
import builtin_vs_vllm_kernel_speed as b
from cellbench.tune.shapes import MoEShape
shape = MoEShape(128, 768, 2048, 8, "fp8_w8a8", (128, 128))
pool = b.start_workers(1, shape, "bf16")
cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
       "num_warps": 4, "num_stages": 3}
opts = b.OLD if sys.argv[1] == "old" else {}
ok, msg = pool.submit(b._warm_variant, opts, 1, cfg, {"capability": [9, 0], "sm_count": 132}
                      ).result(timeout=300)
pool.shutdown()
print(ok, msg)
"""


@pytest.mark.parametrize("variant", ["new", "old"])
def test_workers_compile_the_variants_for_hopper(tmp_path, variant: str) -> None:
    """The benchmark's compile-only workers (the tuner's, told an H200's facts, no GPU opened)
    compile a variant's fp8 kernels at M=1 for sm90 with the shipped M=1 config: the new
    default (operand swap) puts the GEMMs on Hopper's warp-group MMA (wgmma), the old one on
    the warp-level mma.sync that a 16-row tile gets without the swap."""
    import triton.backends.nvidia.compiler  # noqa: F401 - the CUDA backend this warms

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "TRITON_INTERPRET": "0"}
    p = subprocess.run([sys.executable, "-c", _WARM, variant], capture_output=True, text=True,
                       env=env, timeout=600, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stdout[-2000:] + p.stderr[-3000:]
    ptx = [f.read_text() for f in tmp_path.rglob("_moe_gemm_kernel.ptx")]
    assert len(ptx) == 2, "GEMM 1 and GEMM 2"
    wgmma = [t.count("wgmma.mma_async") > 0 for t in ptx]
    assert wgmma == ([True, True] if variant == "new" else [False, False])
