"""Shapes read from model configs: vLLM's sharding rules and every error case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench.tune.shapes import (
    CPU_DEVICE_NAME,
    MoEShape,
    ShapeError,
    device_name,
    main,
    moe_shape,
    read_model_config,
)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"


def cfg(name: str) -> dict:
    return read_model_config(CONFIGS / f"{name}.json")


def test_qwen3_30b_tp_and_ep() -> None:
    c = cfg("qwen3-30b-a3b")
    s1 = moe_shape(c, tp=1)
    assert (s1.num_experts, s1.intermediate_size, s1.hidden_size, s1.topk) == (128, 768, 2048, 8)
    assert s1.dtype is None and s1.block_shape is None
    s2 = moe_shape(c, tp=2)
    assert (s2.num_experts, s2.intermediate_size) == (128, 384)
    s2ep = moe_shape(c, tp=2, ep=True)
    assert (s2ep.num_experts, s2ep.intermediate_size) == (64, 768)


def test_moe_intermediate_size_wins_over_dense_intermediate_size() -> None:
    # Qwen3-MoE configs carry both; the dense one (6144) must not be used.
    assert moe_shape(cfg("qwen3-30b-a3b")).intermediate_size == 768


def test_qwen35_nested_text_config_fp8_auto() -> None:
    s = moe_shape(cfg("qwen3.5-35b-a3b-fp8"), tp=2, ep=True)
    assert (s.num_experts, s.intermediate_size, s.hidden_size, s.topk) == (128, 512, 2048, 8)
    assert s.dtype == "fp8_w8a8" and s.block_shape == (128, 128)


def test_mixtral_fields() -> None:
    s = moe_shape(cfg("mixtral-8x7b"), tp=2)
    assert (s.num_experts, s.intermediate_size, s.hidden_size, s.topk) == (8, 7168, 4096, 2)


def test_deepseek_v3_fields_and_fp8() -> None:
    s = moe_shape(cfg("deepseek-v3"), tp=8, ep=True)
    assert (s.num_experts, s.intermediate_size, s.hidden_size, s.topk) == (32, 2048, 7168, 8)
    assert (s.dtype, s.block_shape) == ("fp8_w8a8", (128, 128))
    s_tp = moe_shape(cfg("deepseek-v3"), tp=8)
    assert (s_tp.num_experts, s_tp.intermediate_size) == (256, 256)


def test_explicit_dtype_overrides() -> None:
    c = cfg("qwen3-30b-a3b-fp8")
    plain = moe_shape(c, dtype=None)
    assert plain.dtype is None and plain.block_shape is None
    per_tensor = moe_shape(c, dtype="fp8_w8a8", block_shape=None)
    assert per_tensor.dtype == "fp8_w8a8" and per_tensor.block_shape is None
    explicit = moe_shape(cfg("qwen3-30b-a3b"), dtype="fp8_w8a8", block_shape="128,128")
    assert explicit.block_shape == (128, 128)
    assert moe_shape(c, dtype="bf16").dtype is None


def test_read_directory_and_roundtrip(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "qwen3-30b-a3b.json").read_text())
    s = moe_shape(read_model_config(tmp_path), tp=2)
    assert MoEShape.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.to_dict() == {
        "num_experts": 128,
        "intermediate_size": 384,
        "hidden_size": 2048,
        "topk": 8,
        "dtype": None,
        "block_shape": None,
    }


@pytest.mark.parametrize(
    "name, kwargs, needle",
    [
        ("qwen3-dense", {}, "expert-count"),
        ("qwen3-30b-a3b", {"tp": 5}, "moe_intermediate_size=768 is not divisible by tp=5"),
        ("qwen3-30b-a3b", {"tp": 3, "ep": True}, "num_experts=128 is not divisible"),
        ("qwen3-30b-a3b", {"tp": 0}, "tp=0"),
        ("qwen3-30b-a3b", {"dtype": "fp4_magic"}, "dtype='fp4_magic'"),
        ("qwen3-30b-a3b", {"block_shape": "128,128", "dtype": None}, "needs a quantised dtype"),
        ("qwen3-30b-a3b", {"dtype": "fp8_w8a8", "block_shape": "128"}, "exactly two"),
        ("qwen3-30b-a3b", {"dtype": "fp8_w8a8", "block_shape": "a,b"}, "two integers"),
        ("qwen3-30b-a3b", {"dtype": "fp8_w8a8", "block_shape": (0, 128)}, "positive"),
        # N = 768 / 4 = 192 is not a multiple of 128.
        ("qwen3-30b-a3b-fp8", {"tp": 4}, "n=128 does not divide per-rank N=192"),
        ("qwen3-30b-a3b", {"dtype": "fp8_w8a8", "block_shape": (128, 96)}, "k=96"),
        ("qwen3-30b-a3b", {"dtype": "fp8_w8a8", "block_shape": (128, 1536)}, "hidden_size"),
    ],
)
def test_errors_name_the_value(name: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(ShapeError, match=None) as ei:
        moe_shape(cfg(name), **kwargs)
    assert needle in str(ei.value)


def test_bad_field_values_and_quant_method() -> None:
    c = dict(cfg("qwen3-30b-a3b"), num_experts=-4)
    with pytest.raises(ShapeError, match="num_experts=-4"):
        moe_shape(c)
    c = dict(cfg("qwen3-30b-a3b"), num_experts_per_tok=200)
    with pytest.raises(ShapeError, match="exceeds"):
        moe_shape(c)
    c = dict(cfg("qwen3-30b-a3b"), quantization_config={"quant_method": "gptq"})
    with pytest.raises(ShapeError, match="quant_method='gptq'"):
        moe_shape(c)


def test_read_errors(tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match="not found"):
        read_model_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ShapeError, match="not valid JSON"):
        read_model_config(bad)
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ShapeError, match="JSON object"):
        read_model_config(lst)


def test_device_name_without_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs no GPU: this check is for machines without one")
    assert device_name() == CPU_DEVICE_NAME


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "qwen3.5-35b-a3b-fp8.json")
    assert (
        main(["--model-config", path, "--tp", "2", "--ep", "--device-name", "AMD_Radeon_R9700"])
        == 0
    )
    out = capsys.readouterr().out
    assert "E=128 N=512 K=2048 topk=8" in out
    assert (
        "E=128,N=512,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json" in out
    )
    path = str(CONFIGS / "qwen3-30b-a3b.json")
    assert main(["--model-config", path, "--tp", "2", "--json", "--device-name", "X"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config_file"] == "E=128,N=384,device_name=X.json"
    assert d["num_experts"] == 128 and d["intermediate_size"] == 384


def test_cli_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "qwen3-30b-a3b.json")
    assert main(["--model-config", path, "--tp", "5"]) == 2
    assert "not divisible by tp=5" in capsys.readouterr().err
    assert main(["--model-config", path, "--tp", "two"]) == 2
    assert main(["--model-config", str(CONFIGS / "missing.json")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main([]) == 2  # --model-config is required


def test_module_runs_as_script() -> None:
    path = str(CONFIGS / "qwen3-30b-a3b.json")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cellbench.tune.shapes",
            "--model-config",
            path,
            "--device-name",
            "D",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("E=128,N=768,device_name=D.json")


def test_hub_id_resolves_through_the_hf_cache(tmp_path, monkeypatch):
    """A model id (as the production config names models) is read from huggingface_hub's cache,
    laid out here by hand the way the hub client writes it; no network is used."""
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    src = Path(__file__).resolve().parents[1] / "data" / "model_configs"
    qwen3 = src / "qwen3-30b-a3b.json"
    (snapshot / "config.json").write_text(qwen3.read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = read_model_config("Qwen/Qwen3-30B-A3B")
    assert moe_shape(cfg, tp=2, ep=True).config_file_name("NVIDIA_H200").startswith("E=64,N=768,")
    with pytest.raises(ShapeError, match="Qwen/Nope"):
        read_model_config("Qwen/Nope")
