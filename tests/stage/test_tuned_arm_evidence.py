"""The tuned arm, proven with a real server: `python -m cellbench.serve.tf_serve` (transformers
serve
with the project's Triton experts, under the interpreter) serving the tiny model, started by the
real serve stage. What each arm's server logs decides whether the job goes on:

* a tuned arm whose tuned folder is empty, or holds a file under another name, fails before
  any number is taken, naming the arm, what was expected, what the log said and the fix;
* an untuned arm that finds a config in the server's own vLLM folder is labelled "shipped".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cellbench.assets import build as assets
from cellbench.serve import stage as serve_stage
from cellbench.tune.kernels import config_lookup
from support import result_fixtures as fx

# The name the server looks for: the tiny model's layer shape on this host's device.
SERVED_NAME = fx.CONFIG_FILE
LAUNCH = fx.CONFIG


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return assets.make_tiny_model(tmp_path_factory.mktemp("assets") / "tiny-qwen3-moe", seed=0)


def _args(tmp_path: Path, model: Path, arm: str, *extra: str) -> list[str]:
    return [
        "--runtime", "local", "--cell-id", "host-cpu/tiny-qwen3-moe/tp1-ep1", "--arm", arm,
        "--model", str(model), "--served-model-name", "tiny-qwen3-moe", "--model-dtype", "fp16",
        "--grid-json", '[{"isl": 16, "osl": 2}]', "--concurrency", "1",
        "--prompts-per-concurrency", "1", "--warmups-per-concurrency", "0",
        "--no-ignore-eos", "--no-gsm8k", "--ready-timeout", "120",
        "--lease-dir", str(tmp_path / "leases"), "--out-dir", str(tmp_path / "out"),
        *extra,
    ]  # fmt: skip


def test_the_tiny_models_served_name_is_what_the_tuner_writes():
    """SERVED_NAME is not a guess: the same rule names the tuner's file and the lookup."""
    shape = assets.TINY_MODEL_SHAPE
    name = config_lookup.config_file_name(
        shape["num_experts"], shape["moe_intermediate_size"], None, None, "CPU_TRITON_INTERPRET"
    )
    assert name == SERVED_NAME


@pytest.mark.slow
@pytest.mark.parametrize(
    ("files", "searched"),
    [({}, SERVED_NAME), ({"E=8,N=64,device_name=CPU_TRITON_INTERPRET.json": LAUNCH}, SERVED_NAME)],
    ids=["empty-folder", "misnamed-file"],
)
def test_tuned_arm_that_did_not_load_its_file_fails(tiny_model, tmp_path, capsys, files, searched):
    tuned = tmp_path / "configs"
    tuned.mkdir()
    for name, table in files.items():
        (tuned / name).write_text(json.dumps({"1": table}))
    args = _args(tmp_path, tiny_model, "tuned", "--tuned-config-dir", str(tuned))
    assert serve_stage.main(args) == 1
    err = capsys.readouterr().err
    assert "tuned arm: expected the server to load the tuned config file, but its log says " \
        "'default'" in err  # fmt: skip
    assert f"{tuned.resolve()}/{searched}" in err  # what the server looked for
    assert "check E, N, device_name, dtype and block_shape" in err  # the fix
    out = tmp_path / "out"
    assert not (out / "bench.json").exists()
    assert "Using default MoE config" in (out / "server.log").read_text()


@pytest.mark.slow
def test_untuned_arm_on_the_servers_own_config_is_labelled_shipped(
    tiny_model, tmp_path, monkeypatch
):
    # Test double: vLLM is not installed here, so an importable `vllm` package holding only
    # its configs folder stands for an image's vLLM that ships a config for this shape. The
    # server finds it as it would find vLLM's (importlib's find_spec; nothing is imported).
    site = tmp_path / "site"
    configs = site.joinpath("vllm", *config_lookup.VLLM_CONFIGS_SUBDIR)
    configs.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (configs / SERVED_NAME).write_text(json.dumps({"1": LAUNCH}))
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert serve_stage.main(_args(tmp_path, tiny_model, "untuned")) == 0
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert bench["moe_config"]["source"] == "shipped"
    assert bench["moe_config"]["paths"] == [str(configs / SERVED_NAME)]
    assert bench["arm_label"] == "shipped" and bench["tuned_config_applied"] is False
