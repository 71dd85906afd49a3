"""The GPU run's model (`small-qwen3-moe`): Qwen3-30B-A3B's per-layer shapes, random bf16 weights.

Built here with one layer instead of eight (the kind's layers are all alike; eight would be
~10 GB on this 2-core machine). Through the real CLI the workflow's rule runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench.assets import build as assets
from cellbench.tune import shapes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_small_model_builds_with_the_real_layer_shape(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "small"
    proc = subprocess.run(
        [sys.executable, "-m", "cellbench.assets", "model", "--kind", "small-qwen3-moe"]
        + ["--num-layers", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["dtype"] == "bfloat16"
    assert cfg["num_hidden_layers"] == 1
    # The fused-MoE shape the tuner and the server's lookup derive from it is the real model's.
    shape = shapes.moe_shape(cfg, tp=1, dtype="auto")
    assert (shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.topk) == (
        128,
        768,
        2048,
        8,
    )
    assert shape.config_file_name("NVIDIA_H200") == "E=128,N=768,device_name=NVIDIA_H200.json"
    meta = json.loads((out / "cellbench_model.json").read_text())
    assert meta["fused_moe_shape"] == {"E": 128, "N": 768, "K": 2048, "topk": 8}
    assert meta["drawn_on"] == "cpu"
    # Experts are nearly all of the weights: that is what makes the MoE layers dominate.
    experts = 128 * 3 * 768 * 2048
    assert 0.95 < experts / meta["parameters"] < 1.0

    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Question: Ava has 12 apples.\nAnswer:")["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg["vocab_size"])
    assert torch.isfinite(logits).all()


def test_unknown_kind_and_bad_layers_fail_before_writing(tmp_path):
    with pytest.raises(ValueError, match="'huge-qwen3-moe' unknown; expected one of"):
        assets.make_model(tmp_path / "m", "huge-qwen3-moe")
    with pytest.raises(ValueError, match="num_layers=0"):
        assets.make_model(tmp_path / "m", "small-qwen3-moe", num_layers=0)
    assert not (tmp_path / "m").exists()


def test_the_workflow_accepts_the_small_kind():
    from cellbench.config import loader as config

    cfg = config.load(ROOT / "config" / "local.yaml")
    cfg["models"] = {"s": {"build": "small-qwen3-moe", "dtype": "bf16"}}
    for group in cfg["cells"]:
        group["models"] = ["s"]
    assert config.validate(cfg)["models"]["s"]["build"] == "small-qwen3-moe"
