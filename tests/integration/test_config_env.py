"""Environment variables per image, model and cell (``env`` in the config): how they merge, what
they rerun, and that they reach the tuner's step and both arms' servers for real.

Refusals of bad names and values are probes of tests/workflow/test_bad_input.py (docs/bad-input.md).
"""

from __future__ import annotations

import copy
import io
import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.runtime import pins
from cellbench.serve import job as serve_job
from cellbench.serve import stage as serve_stage
from support.docker_env import (  # noqa: F401
    PYTHON,
    TEST_REPO,
    TEST_TAGS,
    WORKFLOW,
    docker_client,
    labelled,
    pinned,
    registry,
    write_test_config,
)

ROOT = Path(__file__).resolve().parents[2]
Q30 = "qwen3-30b-a3b-fp8"
ROCM70 = SimpleNamespace(image="rocm7.0", model=Q30, tp="2", ep="2")
ROCM72 = SimpleNamespace(image="rocm7.2", model=Q30, tp="2", ep="2")
SHOWN = ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE", "NCCL_DEBUG")


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / f"config/{name}.yaml").read_text())


def _flag(command: str, flag: str) -> str:
    words = shlex.split(command)
    return words[words.index(flag) + 1]


def test_production_cells_run_with_aiter_off_as_seed_000():
    config = cbconfig.validate(_load("config"))
    for cell in cbconfig.cells(config):
        assert cbconfig.cell_env(config, cell.image, cell.model, cell.tp, cell.ep) == {
            "VLLM_ROCM_USE_AITER": "0"
        }, cell.cell_id


def test_the_embedded_default_sets_no_variable_and_records_none():
    """No ``env`` anywhere: nothing is added to the tracked settings, so finished runs of the
    embedded default keep their recorded settings."""
    config = cbconfig.validate(_load("local"))
    p = pins.Pins.for_config(config)
    for cell in cbconfig.cells(config):
        w = SimpleNamespace(image=cell.image, model=cell.model, tp=str(cell.tp), ep=str(cell.ep))
        assert jobargs.cell_env(config, w) == {}
        assert "env" not in json.loads(jobargs.tune_settings(config, p, w))
        assert "server_env" not in json.loads(jobargs.serve_settings(config, p, w, "pair"))
        assert "--env" not in jobargs.step_flags(config, p, w)


def test_cell_group_over_model_over_image():
    config = _load("config")
    config["images"]["rocm7.0"]["env"] = {"A": "image", "B": "image", "C": "image"}
    config["models"][Q30]["env"] = {"B": "model", "C": "model"}
    config["cells"][0]["env"]["C"] = "cell"  # beside the shipped VLLM_ROCM_USE_AITER
    config = cbconfig.validate(config)
    assert cbconfig.cell_env(config, "rocm7.0", Q30, 2, 2) == {
        "A": "image",
        "B": "model",
        "C": "cell",
        "VLLM_ROCM_USE_AITER": "0",
    }
    # The other image's cells do not get the first image's variables.
    assert cbconfig.cell_env(config, "rocm7.2", Q30, 2, 2) == {
        "B": "model",
        "C": "cell",
        "VLLM_ROCM_USE_AITER": "0",
    }


def test_an_env_edit_changes_only_the_tracked_settings_of_the_cells_it_reaches():
    before = cbconfig.validate(_load("config"))
    after = copy.deepcopy(before)
    after["images"]["rocm7.0"]["env"] = {"NCCL_DEBUG": "INFO"}
    p = pins.Pins.for_config(before)

    def tracked(config, cell):
        return (
            jobargs.tune_settings(config, p, cell),
            jobargs.serve_settings(config, p, cell, "pair"),
            jobargs.serve_settings(config, p, cell, "tuned"),
        )

    assert tracked(before, ROCM72) == tracked(after, ROCM72)
    for old, new in zip(tracked(before, ROCM70), tracked(after, ROCM70), strict=True):
        assert old != new
    assert json.loads(jobargs.tune_settings(after, p, ROCM70))["env"] == {
        "NCCL_DEBUG": "INFO",
        "VLLM_ROCM_USE_AITER": "0",
    }


def test_tuner_step_and_both_servers_get_the_same_variables():
    config = cbconfig.validate(_load("config"))
    config["images"]["rocm7.0"]["env"] = {"NCCL_DEBUG": "INFO"}
    p = pins.Pins.for_config(config)
    steps = shlex.split(jobargs.step_flags(config, p, ROCM70))
    step_env = dict(steps[i + 1].split("=", 1) for i, w in enumerate(steps) if w == "--env")
    server_env = json.loads(jobargs.serve_settings(config, p, ROCM70, "pair"))["server_env"]
    assert step_env == server_env == {"NCCL_DEBUG": "INFO", "VLLM_ROCM_USE_AITER": "0"}
    # Credentials travel only by name, from the host's environment.
    assert {steps[i + 1] for i, w in enumerate(steps) if w == "--pass-env"} >= {"HF_TOKEN"}


def test_an_image_comparison_gives_each_side_its_own_cells_variables(tmp_path):
    config = _load("config")
    config["images"]["rocm7.2"]["env"] = {"NCCL_DEBUG": "WARN"}
    config["serve"]["compare_images"] = True
    config = cbconfig.validate(config)
    p = pins.Pins.for_config(config)
    pair = SimpleNamespace(image_a="rocm7.0", image_b="rocm7.2", model=Q30, tp="2", ep="2")
    folders = {"tuned_a": str(tmp_path / "a"), "tuned_b": str(tmp_path / "b")}
    for folder in folders.values():
        Path(folder).mkdir()
    args = jobargs.compare_args(config, p, pair, SimpleNamespace(**folders))
    sides = [
        serve_job.ImageSpec.from_json(obj, f"side {i}")
        for i, obj in enumerate(json.loads(args)["images"])
    ]
    assert [s.env for s in sides] == [
        {"VLLM_ROCM_USE_AITER": "0"},
        {"NCCL_DEBUG": "WARN", "VLLM_ROCM_USE_AITER": "0"},
    ]
    assert "WARN" in jobargs.compare_settings(config, p, pair)  # tracked there too


def test_serve_stage_refuses_a_malformed_server_env():
    with pytest.raises(ValueError, match="--server-env-json must be a JSON object of string"):
        serve_job._env_arg({"VLLM_ROCM_USE_AITER": 0}, "--server-env-json")
    with pytest.raises(ValueError, match="VLLM_TUNED_CONFIG_FOLDER is set per arm"):
        serve_job._env_arg({"VLLM_TUNED_CONFIG_FOLDER": "/x"}, "--server-env-json")


# --- for real: the tuner's step and both arms' servers -------------------------------------

# No braces: a server command's words go through str.format (for {port}).
ENV_PRINTER = (
    "import json, os; print('env-seen', json.dumps(dict((k, os.environ.get(k)) for k in "
    + repr(SHOWN)
    + "), sort_keys=True), flush=True)"
)


def _seen(log_text: str) -> dict:
    line = next(x for x in log_text.splitlines() if x.startswith("env-seen "))
    return json.loads(line.split(" ", 1)[1])


TINY = SimpleNamespace(image="host-cpu", model="tiny-qwen3-moe", tp="1", ep="1")


def _local_config_with_env() -> dict:
    """The embedded default with variables on its image and on a second group that also holds
    its TINY cell (a cell listed twice gets both groups' variables)."""
    config = _load("local")
    config["images"]["host-cpu"]["env"] = {"VLLM_ROCM_USE_AITER": "0", "NCCL_DEBUG": "INFO"}
    config["cells"].append(
        {
            "images": ["host-cpu"],
            "models": ["tiny-qwen3-moe"],
            "tp": 1,
            "env": {"VLLM_ROCM_USE_AITER_MOE": "0"},
        }
    )
    return cbconfig.validate(config)


def test_the_tune_rules_step_flags_put_the_variables_in_the_tuners_process(tmp_path):
    """What the tune rule runs (``python -m cellbench.runtime.steps {step flags} -- {tuner}``),
    with the
    tuner replaced by a program that prints its environment."""
    config = _local_config_with_env()
    cell = TINY
    flags = shlex.split(jobargs.step_flags(config, pins.Pins.for_config(config), cell))
    log = tmp_path / "tune.log"
    host = {**os.environ, "PYTHONPATH": str(WORKFLOW), "VLLM_ROCM_USE_AITER": "1"}
    proc = subprocess.run(
        [PYTHON, "-m", "cellbench.runtime.steps", *flags, "--log", str(log), "--"]
        + [PYTHON, "-c", ENV_PRINTER],
        cwd=tmp_path,
        env=host,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr + log.read_text()
    # The config's value wins over the host shell's; the cell group's reaches this cell.
    assert _seen(log.read_text()) == {
        "NCCL_DEBUG": "INFO",
        "VLLM_ROCM_USE_AITER": "0",
        "VLLM_ROCM_USE_AITER_MOE": "0",
    }


def _image_with_its_own_env(client) -> str:
    """A test image whose own ENV turns AITER on, as some ROCm images do; pinned ref."""
    base = pinned(client, TEST_TAGS["7.2"])
    client.images.pull(base)
    dockerfile = f"FROM {base}\nENV VLLM_ROCM_USE_AITER=1 VLLM_ROCM_USE_AITER_MOE=1\n"
    built, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, pull=False)
    tag = f"{TEST_REPO}:env-{uuid.uuid4().hex[:10]}"
    built.tag(tag)
    for line in client.api.push(tag.rpartition(":")[0], tag=tag.rpartition(":")[2], stream=True,
                                decode=True):  # fmt: skip
        assert "error" not in line, line
    client.images.remove(tag, noprune=True)
    return pinned(client, tag)


@pytest.mark.docker
def test_the_tuners_container_gets_the_variables(docker_client, registry, tmp_path):  # noqa: F811
    """The same step flags on the docker runtime: the variables are in the container, over
    the image's own ENV (which still holds what the config does not set)."""
    image = _image_with_its_own_env(docker_client)
    config_path = write_test_config(
        tmp_path / "c.yaml", {}, lock=tmp_path / "lock.yaml", hf_cache=str(tmp_path / "hf")
    )
    config = yaml.safe_load(config_path.read_text())
    config["images"]["rocm7.2"]["env"] = {"VLLM_ROCM_USE_AITER": "0", "NCCL_DEBUG": "INFO"}
    config = cbconfig.validate(config)
    cell = SimpleNamespace(image="rocm7.2", model="tiny-a", tp="1", ep="1")
    stand_in_pins = SimpleNamespace(ref=lambda name: image, digest=lambda name: image)
    flags = shlex.split(jobargs.step_flags(config, stand_in_pins, cell))
    run_id = uuid.uuid4().hex
    log = tmp_path / "results" / "tune.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(WORKFLOW),
        "CELLBENCH_AMD_DEVICES": "/dev/null:/dev/kfd",  # no GPU here: a harmless node instead
        "CELLBENCH_RUN_ID": run_id,
    }
    proc = subprocess.run(
        [PYTHON, "-m", "cellbench.runtime.steps", *flags, "--log", str(log), "--"]
        + ["python3", "-c", ENV_PRINTER],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + log.read_text()
    assert _seen(log.read_text()) == {
        "NCCL_DEBUG": "INFO",
        "VLLM_ROCM_USE_AITER": "0",
        "VLLM_ROCM_USE_AITER_MOE": "1",  # the image's own, left as it is
    }
    assert labelled(docker_client, "cellbench.run", run_id) == []


def test_both_arms_servers_get_the_variables(tmp_path):
    """A real serve job (--arm pair) whose servers are the timed stand-in (vLLM cannot run on a
    CPU-only CI machine), started through a shell that first prints what its process got; the
    variables come from the serve rule's tracked settings of a config that sets them."""
    config = _local_config_with_env()
    cell = TINY
    settings = jobargs.serve_settings(config, pins.Pins.for_config(config), cell, "pair")
    server_env = json.dumps(json.loads(settings)["server_env"])
    tuned = tmp_path / "tune" / "configs"
    tuned.mkdir(parents=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    printer = shlex.join([sys.executable, "-c", ENV_PRINTER])
    server = f"{printer} && exec {sys.executable} -m cellbench.serve.timed_server --port $1"
    args = [
        "--runtime", "local", "--cell-id", "host-cpu/tiny-qwen3-moe/tp1-ep1", "--arm", "pair",
        "--model", "timed-model",
        "--server-command-json", json.dumps(["sh", "-c", server, "sh", "{port}"]),
        "--server-env-json", server_env,
        "--tuned-config-dir", str(tuned),
        "--lease-dir", str(tmp_path / "leases"), "--cache-dir", str(tmp_path / "cache"),
        "--grid-json", '[{"isl": 8, "osl": 2}]', "--concurrency", "1",
        "--prompts-per-concurrency", "1", "--warmups-per-concurrency", "0", "--repeats", "1",
        "--no-gsm8k", "--out-dir", str(tmp_path / "serve"),
    ]  # fmt: skip
    assert serve_stage.main(args) == 0
    expected = {"NCCL_DEBUG": "INFO", "VLLM_ROCM_USE_AITER": "0", "VLLM_ROCM_USE_AITER_MOE": "0"}
    for arm in ("untuned", "tuned"):
        out = tmp_path / "serve" / arm
        assert _seen((out / "server.log").read_text()) == expected, arm
        bench = json.loads((out / "bench.json").read_text())
        recorded = bench["moe_config"]["env"]
        assert recorded["VLLM_ROCM_USE_AITER"] == "0" and recorded["VLLM_ROCM_USE_AITER_MOE"] == "0"
        # The tuned folder stays the pipeline's, per arm.
        assert ("VLLM_TUNED_CONFIG_FOLDER" in recorded) == (arm == "tuned")
    assert json.loads((tmp_path / "serve" / "tuned" / "bench.json").read_text())[
        "tuned_config_applied"
    ]
