"""The few-token path chosen per config by measurement (issue 23, item 3): the builtin backend
times the whole call on both paths with the config in hand, the tuner's artifact writer puts
the choice beside vLLM's config JSON (a file vLLM never opens), the config lookup finds it
there, and the kernel's "auto" path follows it. On the CPU the interpreter's times decide,
which says nothing about a GPU: the test checks that the measured choice is the one applied."""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from cellbench.tune import kernels  # noqa: E402
from cellbench.tune.artifacts import path_choices_file_name, write_path_choices, write_vllm_config
from cellbench.tune.backends import BuiltinBackend  # noqa: E402
from cellbench.tune.kernels import config_lookup  # noqa: E402
from cellbench.tune.shapes import MoEShape  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = MoEShape(num_experts=8, intermediate_size=32, hidden_size=64, topk=2)
CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
       "num_warps": 4, "num_stages": 2}  # fmt: skip


@pytest.fixture
def clean_choices():
    import sys

    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    policy.clear_path_choices()
    config_lookup.clear_cache()
    yield policy
    policy.clear_path_choices()
    config_lookup.clear_cache()


def test_measured_choice_travels_from_tuner_to_kernel(tmp_path, monkeypatch, clean_choices):
    policy = clean_choices
    be = BuiltinBackend(SHAPE, "fp32", DEVICE)
    on_gpu = DEVICE == "cuda"
    got = {m: be.measure_paths(m, CFG, on_gpu, repeats=3) for m in (1, 2)}
    for r in got.values():
        assert r is not None and "decode_failed" not in r, r
        assert r["decode_error"] < be.error_bound
        faster = "decode" if r["decode_us"] < r["grouped_us"] else "grouped"
        assert r["path"] == faster
    assert be.measure_paths(policy.DECODE_RULE_MAX_TOKENS + 1, CFG, on_gpu) is None
    name = config_lookup.config_file_name(8, 32, None, None, device="TEST_GPU")
    write_vllm_config(tmp_path, name, {1: CFG, 2: CFG}, None, False)
    write_path_choices(tmp_path, name, {m: {**r, "config": CFG} for m, r in got.items()})
    side = tmp_path / path_choices_file_name(name)
    assert json.loads(side.read_text())["1"]["path"] == got[1]["path"]
    assert (tmp_path / (side.name + ".sha256")).exists()
    # vLLM's file is untouched by the choice: only its six keys per entry
    assert set(json.loads((tmp_path / name).read_text())["1"]) == set(CFG)
    monkeypatch.setenv(config_lookup.ENV_FOLDER, str(tmp_path))
    res = config_lookup.resolve(8, 32, None, None, device="TEST_GPU")
    table = res.path_choices
    assert table == config_lookup.read_path_choices(tmp_path / name)
    assert policy.load_path_choices(table) == 2
    for m in (1, 2):
        assert kernels.kernel_path(m, None, "auto", CFG) == got[m]["path"]


def test_bad_path_choices_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs a config and a path"):
        write_path_choices(tmp_path, "E=8,N=32,device_name=X.json", {1: {"path": "fast"}})
    with pytest.raises(ValueError, match="ends in .json"):
        path_choices_file_name("E=8,N=32")
    assert not list(tmp_path.iterdir())
    assert config_lookup.read_path_choices(tmp_path / "x.json") is None  # no sidecar
