"""The project's Triton fused-MoE kernel as a transformers experts implementation
(cellbench.serve.experts_tf) and `transformers serve` started through cellbench.serve.tf_serve.

Without a GPU the kernel runs under Triton's interpreter (cellbench.tune.kernels sets
TRITON_INTERPRET=1 before triton is imported)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from cellbench.serve import experts_tf, moe_evidence, tf_serve  # noqa: E402
from cellbench.tune.kernels import config_lookup as cl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1}
BIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(cl.ENV_FOLDER, raising=False)
    cl.clear_cache()
    yield
    cl.clear_cache()


def _experts(dtype=torch.float32, seed=0):
    """A Qwen3-MoE experts module of the tiny model's shape, random weights."""
    from cellbench.assets.build import TINY_MODEL_SHAPE
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(**TINY_MODEL_SHAPE, vocab_size=300, intermediate_size=128)
    torch.manual_seed(seed)
    ex = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        ex.gate_up_proj.normal_(0, 0.2)
        ex.down_proj.normal_(0, 0.2)
    return ex.to(dtype).eval(), cfg


def _routing(m, cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(m, cfg.num_experts, generator=g)
    w, idx = torch.topk(logits.softmax(-1), cfg.num_experts_per_tok, dim=-1)
    return idx, w / w.sum(-1, keepdim=True)


def _eager(ex, x, idx, w):
    cfg = ex.config
    cfg._experts_implementation = "eager"
    try:
        return ex(x, idx, w)
    finally:
        cfg._experts_implementation = None


@pytest.mark.parametrize("m", [1, 3, 8, 40])
def test_matches_eager_experts(m):
    ex, cfg = _experts()
    x = torch.randn(m, cfg.hidden_size, generator=torch.Generator().manual_seed(m))
    idx, w = _routing(m, cfg)
    with torch.no_grad():
        want = _eager(ex, x, idx, w)
        got = experts_tf.experts_forward(ex, x, idx, w)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp16_matches_eager_and_looks_up_the_name_without_dtype(tmp_path, monkeypatch):
    ex, cfg = _experts(torch.float16)
    monkeypatch.setenv(cl.ENV_FOLDER, str(tmp_path))
    name = cl.config_file_name(8, 32)  # fp16: no dtype part, as the tuner names it
    (tmp_path / name).write_text(json.dumps({"1": SMALL, "16": BIG}))
    x = torch.randn(5, cfg.hidden_size).half()
    idx, w = _routing(5, cfg)
    with torch.no_grad():
        want = _eager(ex, x, idx, w.half())
        got = experts_tf.experts_forward(ex, x, idx, w.half())
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert cl.resolve(8, 32).path == str(tmp_path / name)


def test_launch_config_follows_the_tuned_file_per_m(tmp_path, monkeypatch, capsys):
    ex, _ = _experts()
    monkeypatch.setenv(cl.ENV_FOLDER, str(tmp_path))
    name = cl.config_file_name(8, 32, "float32")
    (tmp_path / name).write_text(
        json.dumps({"triton_version": "3.6.0", "1": SMALL, "16": {**BIG, "SPLIT_K": 1}})
    )
    assert experts_tf.launch_config(ex, 1, torch.float32) == SMALL
    assert experts_tf.launch_config(ex, 8, torch.float32) == SMALL  # 7 from 1, 8 from 16
    assert (
        experts_tf.launch_config(ex, 9, torch.float32) == BIG
    )  # 8 from 1, 7 from 16; SPLIT_K=1 dropped
    ev = moe_evidence.read_evidence(capsys.readouterr().err, [str(tmp_path)])
    assert ev["source"] == "tuned" and ev["paths"] == [str(tmp_path / name)]


def test_few_token_path_only_where_the_tuner_measured_it_faster(tmp_path, monkeypatch):
    """The tuner's `.paths.json` beside the tuned file decides the path per entry: "decode"
    where it measured the few-token path faster with that entry's config (here M=1, and M=2,
    whose nearest entry is 1), the grouped path elsewhere and for any call past the few-token
    limit; without the sidecar nothing is assumed. The output matches eager on both paths."""
    from cellbench.tune.artifacts import write_path_choices

    ex, cfg = _experts()
    monkeypatch.setenv(cl.ENV_FOLDER, str(tmp_path))
    name = cl.config_file_name(8, 32, "float32")
    table = {"1": {**SMALL, "num_warps": 4, "num_stages": 2}, "4": SMALL, "16": BIG}
    (tmp_path / name).write_text(json.dumps(table))
    assert [experts_tf.launch_path(ex, m, torch.float32) for m in (1, 2, 4)] == ["auto"] * 3
    cl.clear_cache()
    write_path_choices(
        tmp_path,
        name,
        {
            1: {"config": table["1"], "path": "decode", "grouped_us": 9.0, "decode_us": 7.0},
            4: {"config": table["4"], "path": "grouped", "grouped_us": 9.0, "decode_us": 11.0},
        },
    )
    got = {m: experts_tf.launch_path(ex, m, torch.float32) for m in (1, 2, 3, 4, 9)}
    assert got == {1: "decode", 2: "decode", 3: "auto", 4: "auto", 9: "auto"}
    for m in (1, 4):
        x = torch.randn(m, cfg.hidden_size, generator=torch.Generator().manual_seed(m))
        idx, w = _routing(m, cfg)
        with torch.no_grad():
            torch.testing.assert_close(
                experts_tf.experts_forward(ex, x, idx, w),
                _eager(ex, x, idx, w),
                rtol=1e-5,
                atol=1e-5,
            )


def test_expert_parallel_sentinels_contribute_nothing():
    ex, cfg = _experts()
    x = torch.randn(6, cfg.hidden_size)
    idx, w = _routing(6, cfg)
    idx[0, 1] = cfg.num_experts  # routed to another rank
    idx[3, 0] = cfg.num_experts
    ex._is_expert_parallel = True
    with torch.no_grad():
        got = experts_tf.experts_forward(ex, x, idx, w)
        want = _eager(ex, x, idx, w)  # eager skips the sentinel expert
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unsupported_experts_are_refused_by_name():
    ex, _ = _experts()
    ex.has_bias = True
    with pytest.raises(NotImplementedError, match="biases"):
        experts_tf.experts_forward(ex, torch.randn(1, 64), torch.zeros(1, 2, dtype=torch.long),
                                   torch.ones(1, 2))  # fmt: skip


def test_launcher_arguments():
    assert tf_serve.split_args(["M", "--port", "1"]) == (experts_tf.NAME, ["M", "--port", "1"])
    assert tf_serve.split_args(["serve", "M", "--cellbench-experts", "eager"]) == ("eager", ["M"])
    assert tf_serve.split_args(["--cellbench-experts=x", "M"]) == ("x", ["M"])


# ----------------------------------------------------------------- the tiny model, end to end


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf") / "tiny"
    cmd = [sys.executable, "-m", "cellbench.assets", "model", "--kind", "tiny-qwen3-moe"]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, timeout=300)
    return out


@pytest.mark.slow
def test_tiny_model_matches_eager_with_the_kernel(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    name = experts_tf.register()
    eager = AutoModelForCausalLM.from_pretrained(tiny_model, experts_implementation="eager")
    ours = AutoModelForCausalLM.from_pretrained(tiny_model, experts_implementation=name)
    assert ours.config._experts_implementation == name
    ids = torch.randint(
        0, eager.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = eager(ids).logits
        got_default = ours(ids).logits  # no file: vLLM's default rule
        monkeypatch.setenv(cl.ENV_FOLDER, str(tmp_path))
        (tmp_path / cl.config_file_name(8, 32, "float32")).write_text(json.dumps({"1": SMALL}))
        cl.clear_cache()
        got_tuned = ours(ids).logits
    torch.testing.assert_close(got_default, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_tuned, want, rtol=1e-5, atol=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_transformers_serve_through_the_launcher_uses_the_tuned_file(tiny_model, tmp_path):
    import requests

    tuned = tmp_path / "tuned"
    tuned.mkdir()
    # The server loads the fp32 weights as they are: vLLM's name then carries dtype=float32.
    name = cl.config_file_name(8, 32, "float32")
    (tuned / name).write_text(json.dumps({"triton_version": "3.6.0", "1": SMALL, "64": BIG}))
    port = _free_port()
    env = {**os.environ, cl.ENV_FOLDER: str(tuned), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "cellbench.serve.tf_serve", str(tiny_model), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--device", "cpu", "--continuous-batching"]
    cmd += ["--cb-num-blocks", "64", "--cb-block-size", "32", "--cb-max-batch-tokens", "512"]
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        body = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r = requests.post(
                    f"{base}/v1/completions",
                    json={"model": str(tiny_model), "prompt": "one two three", "max_tokens": 4},
                    timeout=60,
                )
                if r.ok:
                    body = r.json()
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        text = log_path.read_text(errors="replace")
        assert body is not None, f"server never answered; log tail:\n{text[-3000:]}"
        assert body["choices"] and body["usage"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log_path.read_text(errors="replace")
    assert f"Using configuration from {tuned / name} for MoE layer." in text
    assert text.count("Using configuration from") == 1
    ev = moe_evidence.read_evidence(text, [str(tuned)])
    assert ev["source"] == "tuned" and moe_evidence.arm_problem("tuned", ev) is None
