"""The embedded default's assets: GSM8K-format set (its task: test_gsm8k), tiny Qwen3-MoE model."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cellbench.assets import build as assets
from cellbench.serve import random_prompts


def _read_jsonl(p: Path) -> list[dict]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def test_gsm8k_set_is_deterministic_and_correct(tmp_path):
    a = assets.make_gsm8k_set(tmp_path / "a", 30, seed=5, n_train=10)
    b = assets.make_gsm8k_set(tmp_path / "b", 30, seed=5, n_train=10)
    c = assets.make_gsm8k_set(tmp_path / "c", 30, seed=6, n_train=10)
    test_a = (a / assets.GSM8K_TEST_FILE).read_bytes()
    assert test_a == (b / assets.GSM8K_TEST_FILE).read_bytes()
    assert test_a != (c / assets.GSM8K_TEST_FILE).read_bytes()
    test = _read_jsonl(a / assets.GSM8K_TEST_FILE)
    train = _read_jsonl(a / assets.GSM8K_TRAIN_FILE)
    assert len(test) == 30 and len(train) == 10
    assert not {r["question"] for r in test} & {r["question"] for r in train}
    for r in test + train:
        assert set(r) == {"question", "answer"}
        final = re.search(r"#### (-?\d+)$", r["answer"])
        assert final, r["answer"]
        # Every <<expr=value>> step is right, and the last step's value is the answer.
        steps = re.findall(r"<<([0-9+\-*/ ]+)=(-?\d+)>>", r["answer"])
        assert steps
        for expr, val in steps:
            assert eval(expr) == int(val), (expr, val)  # noqa: S307 - digits and + - * / only
        assert steps[-1][1] == final.group(1)


def test_gsm8k_bad_n_names_the_value(tmp_path):
    with pytest.raises(ValueError, match="n=0"):
        assets.make_gsm8k_set(tmp_path / "x", 0, seed=0)
    assert not (tmp_path / "x").exists()


def test_gsm8k_cli_replaces_existing_dir(tmp_path):
    out = tmp_path / "g"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert assets.main(["gsm8k", "--out", str(out), "--n", "4", "--n-train", "2"]) == 0
    assert not (out / "stale.txt").exists()
    assert len(_read_jsonl(out / assets.GSM8K_TEST_FILE)) == 4
    # No temporary siblings are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return assets.make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.mark.slow
def test_tiny_model_loads_offline_and_has_the_shape(tiny_model, monkeypatch):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = AutoConfig.from_pretrained(tiny_model)
    assert cfg.model_type == "qwen3_moe"
    assert (cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_hidden_layers) == (64, 32, 2)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.head_dim) == (8, 2, 32)
    meta = json.loads((tiny_model / "cellbench_model.json").read_text())
    assert meta["fused_moe_shape"] == {"E": 8, "N": 32, "K": 64, "topk": 2}
    assert (tiny_model / "model.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok("Question: Ava has 12 apples.\nAnswer:")["input_ids"]
    assert tok.decode(ids) == "Question: Ava has 12 apples.\nAnswer:"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in chat
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg.vocab_size)
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_prompts_of_exact_length_with_model_tokenizer(tiny_model):
    tok = random_prompts.load_tokenizer(str(tiny_model))
    assert isinstance(tok, random_prompts.LocalTokenizer)
    for isl in (1, 32, 512):
        for p in random_prompts.make_prompts(tok, 4, isl, seed=isl):
            assert len(tok.encode(p.text)) == isl


@pytest.mark.slow
def test_same_seed_same_weights(tiny_model, tmp_path):
    again = assets.make_tiny_model(tmp_path / "again", seed=0)
    a = (tiny_model / "model.safetensors").read_bytes()
    assert a == (again / "model.safetensors").read_bytes()
    assert (tiny_model / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    assert oct(os.stat(again).st_mode & 0o777) == oct(0o755)


def test_tiny_model_bad_vocab_fails_before_writing(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=10"):
        assets.make_tiny_model(tmp_path / "m", vocab_size=10)
    assert not (tmp_path / "m").exists()
