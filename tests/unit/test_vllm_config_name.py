"""Config file names must equal the names of the files vLLM 0.34 ships (copied into tests/data)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cellbench.tune.shapes import MoEShape, moe_shape, read_model_config

DATA = Path(__file__).resolve().parents[1] / "data"
SHIPPED = sorted(p.name for p in (DATA / "vllm-configs").glob("*.json"))

# (model fixture, tp, ep, dtype, block_shape, device) -> expected shipped file
CASES = [
    (
        "qwen3-30b-a3b",
        1,
        False,
        "auto",
        "auto",
        "NVIDIA_H200",
        "E=128,N=768,device_name=NVIDIA_H200.json",
    ),
    (
        "qwen3-30b-a3b",
        2,
        False,
        "auto",
        "auto",
        "NVIDIA_H200",
        "E=128,N=384,device_name=NVIDIA_H200.json",
    ),
    (
        "qwen3-30b-a3b-fp8",
        1,
        False,
        "auto",
        "auto",
        "NVIDIA_H200",
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    ),
    (
        "qwen3-30b-a3b-fp8",
        2,
        False,
        "auto",
        "auto",
        "NVIDIA_H200",
        "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
    ),
    (
        "qwen3-30b-a3b-fp8",
        2,
        True,
        "auto",
        "auto",
        "AMD_Radeon_R9700",
        "E=64,N=768,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json",
    ),
    (
        "qwen3.5-35b-a3b-fp8",
        2,
        True,
        "auto",
        "auto",
        "AMD_Radeon_R9700",
        "E=128,N=512,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json",
    ),
]


def test_reference_files_present() -> None:
    assert len(SHIPPED) == 6


@pytest.mark.parametrize("model, tp, ep, dtype, block, dev, expected", CASES)
def test_name_matches_shipped_file(model, tp, ep, dtype, block, dev, expected) -> None:
    cfg = read_model_config(DATA / "model_configs" / f"{model}.json")
    name = moe_shape(cfg, tp, ep, dtype=dtype, block_shape=block).config_file_name(dev)
    assert name == expected
    assert name in SHIPPED


def test_every_shipped_file_is_covered() -> None:
    assert sorted(c[-1] for c in CASES) == SHIPPED


def test_name_format_details() -> None:
    s = MoEShape(8, 14336, 4096, 2, "int8_w8a16", None)
    assert s.config_file_name("AMD_Instinct_MI300X") == (
        "E=8,N=14336,device_name=AMD_Instinct_MI300X,dtype=int8_w8a16.json"
    )
    s = MoEShape(256, 256, 7168, 8, "fp8_w8a8", (128, 128))
    assert " " not in s.config_file_name("NVIDIA_H200")
    assert s.config_file_name("NVIDIA_H200").endswith(",block_shape=[128,128].json")
