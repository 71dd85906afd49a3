"""vLLM's own fused-MoE Triton kernel, run from vLLM's Python sources (a pip-downloaded wheel's
files, extracted by workflow/scripts/vllm-kernel-src.sh), without vLLM installed (issue 23).

On a machine without a GPU everything runs under Triton's interpreter, in fp32/fp16 (the
interpreter's bf16 dot is unusable: see test_kernel.py). The sources come from
CELLBENCH_VLLM_SOURCE, else from the git-ignored .vllm-src/vllm-0.34.0, which the fixture
makes once with the bootstrap script (it downloads vLLM's wheel from PyPI); without network
and without a folder the tests skip, saying so.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench.tune import (  # noqa: E402
    backends,
    cli,
    kernels,  # noqa: E402
)
from cellbench.tune import vllm_source as vs  # noqa: E402
from cellbench.tune.kernels import reference  # noqa: E402
from cellbench.tune.kernels.reference import _dequantise, relative_error  # noqa: E402
from cellbench.tune.shapes import MoEShape, moe_shape  # noqa: E402
from support.tiny_moe import TINY  # noqa: E402  (the one tiny MoE shape of the tuner tests)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SRC = ROOT / ".vllm-src" / "vllm-0.34.0"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# vLLM's kernel calls tl.dot at Triton's default input precision, which on an NVIDIA GPU puts
# fp32 operands through TF32 (10 explicit mantissa bits, as many as fp16 has); the project's
# fp32 bound assumes IEEE fp32 dots, which only the interpreter gives it. Measured on one H100
# (benchmarks/results/gpu_tests_h100_2026-12-06): 2.1e-3 to 2.9e-3 against the float64
# reference in these tests. On a GPU, fp32 problems are held to fp16's bound instead.
TF32_BOUND = reference.error_bound("fp16")


def _bound_for_vllms_kernel(p) -> float:
    """The error bound vLLM's kernel is held to on this machine for problem p."""
    if DEVICE != "cpu" and p.quant is None and p.dtype == "fp32":
        return TF32_BOUND
    return reference.problem_error_bound(p)


@pytest.fixture(scope="session")
def vllm_src() -> Path:
    """A folder of vLLM's kernel sources: the env's, else the bootstrap script's (made once)."""
    named = vs.source_from_env()
    if named:
        return Path(named)
    if not (DEFAULT_SRC / "SOURCE.json").is_file():
        p = subprocess.run(
            ["bash", str(ROOT / "workflow" / "scripts" / "vllm-kernel-src.sh"), str(DEFAULT_SRC)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if p.returncode != 0:
            pytest.skip(
                "vLLM's kernel sources are absent and workflow/scripts/vllm-kernel-src.sh "
                f"could not fetch them (no network?): {p.stderr.strip()[-300:]}"
            )
    return DEFAULT_SRC


@pytest.fixture(scope="session")
def loaded(vllm_src):
    return vs.load_vllm_source(vllm_src)


@pytest.fixture
def no_vllm_env(monkeypatch):
    # Set first so that teardown restores the variable's earlier state (normally: unset) even
    # when the code under test sets it: the tuner's plan exports --vllm-source as
    # CELLBENCH_VLLM_SOURCE for its compile workers, and left set it let a later test's
    # `--backend vllm` run instead of being refused (test_tuner_cli's bad-input case).
    monkeypatch.setenv(vs.SOURCE_ENV, "")
    monkeypatch.delenv(vs.SOURCE_ENV)


def _cfg(bm: int, bn: int, bk: int) -> dict[str, int]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 2}  # fmt: skip


# M=1: 1*2*4 <= 8 experts, vLLM's few-token rule (one block per token-expert pair, no
# alignment); M=5 and 24: the project's alignment feeds vLLM's kernel.
@pytest.mark.parametrize("m", [1, 5, 24])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_vllm_kernel_matches_the_reference(loaded, m, dtype) -> None:
    p = kernels.make_problem(MoEShape(8, 32, 64, 2), m, dtype, DEVICE, seed=11 + m)
    out = loaded.fused_experts(p, _cfg(16, 32, 32))
    assert out.shape == (m, 64) and out.dtype == p.hidden_states.dtype
    err = relative_error(out, reference.torch_moe_reference(p))
    assert err < _bound_for_vllms_kernel(p), (dtype, m, err)


def test_record_names_vllms_parts_and_the_wheel(loaded, vllm_src) -> None:
    rec = loaded.record()
    src = json.loads((vllm_src / "SOURCE.json").read_text())
    assert rec["vllm_version"] == src["version"]
    assert rec["source"].startswith(f"wheel vllm-{src['version']}")
    assert {"fused_moe_kernel", "invoke_fused_moe_triton_kernel"} <= set(rec["vllm_parts"])
    assert "moe_align_block_size" in rec["project_parts"]
    # the kernel runs from the extracted file itself: Triton read its text from there
    kernel = loaded.namespace["fused_moe_kernel"]
    assert (
        Path(kernel.fn.__code__.co_filename).resolve()
        == (vllm_src / "vllm/model_executor/layers/fused_moe/fused_moe.py").resolve()
    )


# Hopper (9, 0): vLLM's launcher swaps the operands for fp8 at BLOCK_SIZE_M < 64 and
# BLOCK_SIZE_N >= 64; the group (16) is below BLOCK_SIZE_N so the scales load per column.
@pytest.mark.skipif(
    DEVICE != "cpu",
    reason="needs no GPU (a CPU-interpreter test): it holds an fp8 GEMM with BLOCK_SIZE_K=16 "
    "(tied to its 16-wide scale groups) to 1e-5, a bound for the interpreter's fp32-accumulated "
    "fp8 dots; on a GPU "
    "Triton cannot compile an fp8 dot with K < 32, and on sm90 it accumulates fp8 dots in "
    "reduced precision by default (max_num_imprecise_acc)",
)
@pytest.mark.parametrize("capability", [None, (9, 0)], ids=["plain", "sm90-swap-ab"])
def test_vllm_fp8_block_gemm_on_its_quantised_inputs(vllm_src, capability) -> None:
    src = vs.load_vllm_source(vllm_src, capability=capability)
    cfg = _cfg(16, 64, 16)
    assert src.namespace["enable_swap_ab"](16, 64) is (capability == (9, 0))
    p = kernels.make_problem(MoEShape(8, 32, 64, 2, "fp8_w8a8", (16, 16)), 6, "fp32", DEVICE, 5)
    prep = src.prepare(p, cfg)
    c1 = src.gemm(p, prep, cfg, second=False)
    xq, xs = prep["a1"], prep["a1_scale"]
    x64 = xq.double() * xs.double().repeat_interleave(16, 1)
    w1 = p.w1
    ref = torch.stack([
        x64[i // 2] @ _dequantise(w1[e], p.quant.w1_scale[e], (16, 16)).T
        for i, e in enumerate(p.topk_ids.flatten().tolist())
    ])  # fmt: skip
    assert relative_error(c1.view(-1, 64), ref) < 1e-5


def test_folder_without_the_sources_is_named(tmp_path) -> None:
    with pytest.raises(vs.VllmSourceError, match="does not exist.*vllm-kernel-src.sh"):
        vs.load_vllm_source(tmp_path / "nowhere")
    (tmp_path / "vllm/model_executor/layers/fused_moe").mkdir(parents=True)
    with pytest.raises(vs.VllmSourceError, match="lacks vllm/model_executor/.*fused_moe.py"):
        vs.load_vllm_source(tmp_path)


def test_sources_without_the_kernel_are_named(tmp_path) -> None:
    d = tmp_path / "vllm/model_executor/layers/fused_moe"
    d.mkdir(parents=True)
    (d / "fused_moe.py").write_text("def something_else():\n    pass\n")
    (d / "utils.py").write_text("def enable_swap_ab(m, n):\n    return False\n")
    with pytest.raises(vs.VllmSourceError, match="no top-level function .*fused_moe_kernel"):
        vs.load_vllm_source(tmp_path)


def test_backend_without_vllm_runs_vllms_kernel_from_the_sources(vllm_src, no_vllm_env) -> None:
    if backends.vllm_refusal() is None:
        pytest.skip("a usable vLLM is installed here: the backend calls its fused_experts")
    shape = moe_shape(TINY, 1, 1)
    be = backends.make_backend("vllm", shape, "fp32", DEVICE, vllm_source=str(vllm_src))
    assert be.kernel_record()["vllm_parts"][0] == "write_zeros_to_output"
    p = be.make_problem(5, 3)
    cfg = _cfg(16, 32, 32)
    err = relative_error(be.output(p, cfg), be.reference(p))
    # the backend's own bound is IEEE fp32's; vLLM's kernel runs TF32 dots on a GPU
    assert err < (be.error_bound if DEVICE == "cpu" else TF32_BOUND)
    # GEMM-only closures (inputs prepared once) give GEMM 2's routed output
    g1, g2 = be.gemm_calls(p, cfg)
    g1()
    c3 = g2()
    full = be.output(p, cfg)
    assert torch.allclose(c3.sum(dim=1), full, rtol=1e-5, atol=1e-6)
    # vLLM's few-token rule is a constexpr of its kernel: M=1 and M=8 compile apart
    assert be.m_specialisation(1) != be.m_specialisation(8)


def test_backend_without_vllm_or_sources_is_refused_clearly(no_vllm_env) -> None:
    if backends.vllm_refusal() is None:
        pytest.skip("a usable vLLM is installed here")
    shape = moe_shape(TINY, 1, 1)
    with pytest.raises(backends.BackendError, match=vs.SOURCE_ENV):
        backends.make_backend("vllm", shape, "fp32", DEVICE)


def test_tuner_cli_tunes_vllms_kernel_from_the_sources(vllm_src, tmp_path, no_vllm_env) -> None:
    if backends.vllm_refusal() is None:
        pytest.skip("a usable vLLM is installed here: the backend calls its fused_experts")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "tuned"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(
            ["--model-config", str(cfg), "--tp", "1", "--batch-sizes", "1,4", "--backend",
             "vllm", "--vllm-source", str(vllm_src), "--max-configs", "6", "--out", str(out)]
        )  # fmt: skip
    assert rc == 0, err.getvalue()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "vllm"
    assert summary["vllm_kernel"]["source"].startswith("wheel vllm-")
    assert "fused_moe_kernel" in summary["vllm_kernel"]["vllm_parts"]
    assert set(summary["entries"]) == {"1", "4"}
    for e in summary["entries"].values():
        assert e["time_us"] > 0


def test_tuner_cli_refuses_a_missing_source_folder(tmp_path, no_vllm_env) -> None:
    if backends.vllm_refusal() is None:
        pytest.skip("a usable vLLM is installed here")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    env = {k: v for k, v in os.environ.items() if k != vs.SOURCE_ENV}
    env["PYTHONPATH"] = str(ROOT / "workflow")
    p = subprocess.run(
        [sys.executable, "-m", "cellbench.tune", "--model-config", str(cfg), "--backend",
         "vllm", "--vllm-source", str(tmp_path / "absent"), "--batch-sizes", "1", "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "absent does not exist" in p.stderr and "vllm-kernel-src.sh" in p.stderr
    assert not (tmp_path / "out").exists()


def test_ops_folder_without_a_record_is_named(tmp_path) -> None:
    with pytest.raises(vs.VllmSourceError, match=r"has no SOURCE\.json.*vllm_ops_pack\.py"):
        vs.load_vllm_ops(tmp_path)


@pytest.mark.skipif(DEVICE != "cpu", reason="needs no GPU: this check is for machines without one")
def test_without_a_gpu_every_part_says_it_is_the_projects_and_why(vllm_src, tmp_path) -> None:
    """vLLM's compiled ops are CUDA libraries: on a CPU none is loaded, each part of the call
    names the project's op and the reason (the tables print these lines per column), and the
    call still matches the reference."""
    (tmp_path / "SOURCE.json").write_text('{"version": "0.34.0", "libraries": {}}')
    src = vs.load_vllm_source(vllm_src, ops=tmp_path)
    parts = src.record()["parts"]
    assert set(parts) == set(vs.PROJECT_PARTS)
    why = "project's (vLLM's compiled ops need a CUDA GPU"
    assert all(v.startswith(why) for v in parts.values()), parts
    assert src.record()["project_parts"] == list(vs.PROJECT_PARTS)
    p = kernels.make_problem(MoEShape(8, 32, 64, 2), 5, "fp32", DEVICE, seed=3)
    err = relative_error(src.fused_experts(p, _cfg(16, 32, 32)), reference.torch_moe_reference(p))
    assert err < reference.problem_error_bound(p)
