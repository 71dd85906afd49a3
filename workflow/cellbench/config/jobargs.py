"""Command lines of the workflow's jobs, split into what shapes a result and what does not.

Snakemake reruns a job when one of its rule's params changes, but only params it can compare:
plain values computed from wildcards and config. A params function that names ``input``,
``output``, ``threads`` or ``resources`` is "derived" and left out of that comparison. So each
measuring rule gets two params built here:

* ``settings`` (tracked): every flag whose value changes the job's output (the model and its
  layout, the load grid, repeats, GSM8K shots, the pinned digest, the GPU vendor ...). Editing
  any of these in the config reruns the job and everything downstream of it.
* ``host`` (deliberately untracked: the rules wrap it in a function of ``input``): where things
  live on this machine and how long to wait (lease folder, host GPU count, caches, the
  interpreter, ``ready_timeout_s``, input paths). Changing these reruns nothing.

docs/rerun-triggers.md lists, per config setting, the jobs an edit reruns; a test checks that
table against Snakemake's own plan.

The functions take the validated config, the image pins (``cellbench.runtime.pins.Pins``) and the
job's
wildcards (anything with ``image``, ``model``, ``tp``, ``ep`` attributes; ``image_a`` and
``image_b`` for a comparison), so unit tests can call them without Snakemake.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from cellbench.common.secrets import SECRET_ENV
from cellbench.config import loader as cbconfig

LEASE_DIR = "results/.leases"


def cell_id(wildcards: Any, image: str | None = None) -> str:
    return f"{image or wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}"


def local_model_dir(model: str) -> str:
    return f"results/assets/models/{model}"


def model_source(config: dict, model: str) -> str:
    """What the server and the tuner are given: a locally built model's folder or a hub id."""
    entry = config["models"][model]
    if entry.get("build"):
        return local_model_dir(model)
    return entry["hf_id"]


def cell_env(config: dict, wildcards: Any, image: str | None = None) -> dict[str, str]:
    """The configured variables of the job's cell (image, model, cell group;
    cellbench.config.loader):
    the tuner's step and both arms' servers get the same ones."""
    return cbconfig.cell_env(
        config, image or wildcards.image, wildcards.model, int(wildcards.tp), int(wildcards.ep)
    )


def gpus_per_server(config: dict, wildcards: Any) -> int:
    """GPUs one server (or the tuner) of a cell holds: its TP size in containers, none for
    host processes or a CPU-only image (gpu_vendor none)."""
    if config["runtime"] != "docker" or config["gpu_vendor"] == "none":
        return 0
    return int(wildcards.tp)


def _gpu_flags(config: dict, wildcards: Any) -> list[str]:
    """Which GPUs a containerised job gets: vendor and count shape what is measured."""
    if config["runtime"] != "docker":
        return []
    return ["--gpu-vendor", config["gpu_vendor"], "--gpus", str(gpus_per_server(config, wildcards))]


def _server_gpu_flags(config: dict, wildcards: Any) -> list[str]:
    """The GPUs of a serving job: a container's per server, or on the local runtime the
    config's ``gpus``, which both arms' host processes share (none: the CPU, no flags)."""
    if config["runtime"] == "docker" or config["gpus"] == 0:
        return _gpu_flags(config, wildcards)
    return ["--gpu-vendor", config["gpu_vendor"], "--gpus", str(config["gpus"])]


# --- tune -----------------------------------------------------------------------------------


def tune_settings(config: dict, pins: Any, wildcards: Any) -> str:
    """The tune job's tracked values (a rerun trigger; the shell does not read it): where it
    runs (runtime, pinned digest, GPUs), the tuner's command line and the code version."""
    values = {
        "runtime": config["runtime"],
        "image_digest": pins.digest(wildcards.image),
        "gpus": _gpu_flags(config, wildcards),
        "tuner": tuner_args(config, wildcards),
        "code_version": str(config["tune"]["code_version"]),
    }
    env = cell_env(config, wildcards)
    if env:  # only when set, so configs without variables keep their recorded settings
        values["env"] = env
    return json.dumps(values, sort_keys=True)


def tuner_args(config: dict, wildcards: Any) -> str:
    """The in-container tuner's command line for a cell (``python -m cellbench.tune``)."""
    model = config["models"][wildcards.model]
    tune = config["tune"]
    model_config = model.get("model_config") or model_source(config, wildcards.model)
    args = ["--model-config", model_config, "--tp", str(wildcards.tp)]
    if int(wildcards.ep) > 1:
        args.append("--ep")
    dtype = model["dtype"]
    if dtype in ("bf16", "fp16", "fp32"):
        # Unquantised: no dtype in vLLM's file name; the activations' dtype is what differs.
        args += ["--dtype", "none", "--act-dtype", dtype]
    else:
        args += ["--dtype", dtype]
    block = model["block_shape"]
    args += [
        "--block-shape",
        f"{block[0]},{block[1]}" if isinstance(block, list) else str(block or "none"),
    ]
    args += ["--batch-sizes", ",".join(map(str, cbconfig.batch_sizes(config)))]
    args += ["--mode", tune["mode"], "--backend", tune["backend"]]
    if tune["max_configs"]:
        args += ["--max-configs", str(tune["max_configs"])]
    return shlex.join(args)


def step_flags(config: dict, pins: Any, wildcards: Any) -> str:
    """``python -m cellbench.runtime.steps`` flags: runtime, image and GPUs (all of which shape the
    result, and are repeated in ``tune_settings``), then host details."""
    args = ["--runtime", config["runtime"]]
    # The cell's variables (tracked in tune_settings): in the container, or the tuner process's.
    for name, value in cell_env(config, wildcards).items():
        args += ["--env", f"{name}={value}"]
    if config["runtime"] == "docker":
        args += ["--image-ref", pins.ref(wildcards.image), *_gpu_flags(config, wildcards)]
        args += [
            "--total-gpus",
            str(config["gpus"]),
            "--lease-dir",
            LEASE_DIR,
            "--mount",
            f"{Path(config['hf_cache']).expanduser()}:/root/.cache/huggingface:rw",
            *(x for name in SECRET_ENV for x in ("--pass-env", name)),
            "--label",
            f"cellbench.cell={cell_id(wildcards)}",
        ]
    return shlex.join(args)


# --- serve ----------------------------------------------------------------------------------


def local_device(config: dict) -> str:
    """The torch device of the local runtime's servers: a GPU when the config gives it one
    (``gpus``; ROCm's torch names its GPUs ``cuda`` too), else the CPU."""
    return "cuda" if config["gpus"] > 0 else "cpu"


def _load_flags(config: dict, wildcards: Any) -> list[str]:
    """The model, its layout and the load grid: shared by every serving job."""
    model = config["models"][wildcards.model]
    serve = config["serve"]
    return [
        "--model",
        model_source(config, wildcards.model),
        "--served-model-name",
        wildcards.model,
        "--tp",
        str(wildcards.tp),
        "--ep",
        str(wildcards.ep),
        "--serve-args-json",
        json.dumps(model["serve_args"]),
        "--server",
        serve["server"],
        "--model-dtype",
        model["dtype"],
        *(["--device", local_device(config)] if config["runtime"] == "local" else []),
        "--grid-json",
        json.dumps(serve["grid"]),
        "--concurrency",
        ",".join(map(str, serve["concurrency"])),
        "--prompts-per-concurrency",
        str(serve["prompts_per_concurrency"]),
        "--warmups-per-concurrency",
        str(serve["warmups_per_concurrency"]),
        "--repeats",
        str(serve["repeats"]),
        "--ignore-eos" if serve["ignore_eos"] else "--no-ignore-eos",
        # A gate, not a measurement; still tracked, since a stricter gate must re-judge
        # results that passed the old one.
        "--max-failed-share",
        str(serve["max_failed_share"]),
        *_load_shape_flags(serve),
    ]


def _load_shape_flags(serve: dict) -> list[str]:
    """Request-rate points, goodput SLOs and the probes' sampling intervals (issue 24). Each
    only when it differs from its default, so configs without them keep their recorded
    params (and their finished jobs); the defaults are serve_stage's own."""
    args: list[str] = []
    if serve["request_rates"]:
        args += ["--request-rates", ",".join(f"{r:g}" for r in serve["request_rates"])]
        args += ["--request-rate-prompts", str(serve["request_rate_prompts"])]
        args += ["--burstiness", str(serve["burstiness"])]
    if serve["goodput"]:
        args += ["--goodput", *(f"{k}:{v:g}" for k, v in sorted(serve["goodput"].items()))]
    if serve["metrics_interval_s"] != 0.5:
        args += ["--metrics-interval", str(serve["metrics_interval_s"])]
    if serve["telemetry_interval_s"] != 0.2:
        args += ["--telemetry-interval", str(serve["telemetry_interval_s"])]
    return args


def serve_settings(config: dict, pins: Any, wildcards: Any, arm: str) -> str:
    """serve_stage's tracked flags for one arm, or both (``arm="pair"``)."""
    gsm8k = config["gsm8k"]
    args = [
        "--runtime",
        config["runtime"],
        "--cell-id",
        cell_id(wildcards),
        "--arm",
        arm,
        *_load_flags(config, wildcards),
        "--gsm8k-fewshot",
        str(gsm8k["num_fewshot"]),
    ]
    if gsm8k["limit"]:
        args += ["--gsm8k-limit", str(gsm8k["limit"])]
    args += ["--gsm8k-max-gen-toks", str(gsm8k["max_gen_toks"])]
    args += ["--gsm8k-concurrency", str(gsm8k["num_concurrent"])]
    # The questions (a local file's content is tracked as the serve rule's input), how lm-eval
    # asks (chat prompts differ from plain ones) and how many server starts run them.
    args += ["--gsm8k-dataset", gsm8k["dataset"], "--gsm8k-api", gsm8k["api"]]
    args += ["--gsm8k-instances", str(gsm8k["instances"])]
    env = cell_env(config, wildcards)
    if env:  # both arms' servers get them; only when set, as in tune_settings
        args += ["--server-env-json", json.dumps(env, sort_keys=True)]
    if config["runtime"] == "docker":
        args += ["--image-ref", pins.ref(wildcards.image)]
    args += ["--image-digest", pins.digest(wildcards.image)]
    args += _server_gpu_flags(config, wildcards)
    return shlex.join(args)


def _server_host_flags(config: dict) -> list[str]:
    """Host details of serving jobs: none of them changes a number."""
    args = ["--lease-dir", LEASE_DIR, "--ready-timeout", str(config["serve"]["ready_timeout_s"])]
    if config["runtime"] == "local" and config["serve"]["server"] == "vllm":
        # Where vLLM is installed on this host (its own environment): what it serves is
        # tracked through --server and the model, not through the interpreter's path.
        args += ["--vllm-python", str(Path(config["serve"]["vllm_python"]).expanduser())]
    if config["runtime"] == "docker":
        args += [
            "--total-gpus",
            str(config["gpus"]),
            "--hf-cache",
            str(Path(config["hf_cache"]).expanduser()),
        ]
    return args


def serve_host(config: dict, input: Any) -> str:
    """serve_stage's untracked flags: host details and the input folders (whose content is
    tracked through Snakemake's input triggers)."""
    args = _server_host_flags(config)
    names = set(input.keys())
    if "tuned" in names:
        args += ["--tuned-config-dir", input.tuned]
    return shlex.join(args)


# --- image comparisons ----------------------------------------------------------------------


def compare_sides(config: dict, pins: Any, wildcards: Any) -> list[dict[str, Any]]:
    sides = []
    for image in (wildcards.image_a, wildcards.image_b):
        sides.append(
            {
                "name": image,
                "cell": cell_id(wildcards, image),
                "image_ref": pins.ref(image) if config["runtime"] == "docker" else None,
                "image_digest": pins.digest(image),
            }
        )
        env = cell_env(config, wildcards, image)
        if env:  # each image's server gets its own cell's variables
            sides[-1]["env"] = env
    return sides


def _compare_flags(config: dict, wildcards: Any) -> list[str]:
    return [
        "--runtime",
        config["runtime"],
        "--cell-id",
        f"{wildcards.image_a}-vs-{wildcards.image_b}/{wildcards.model}"
        f"/tp{wildcards.tp}-ep{wildcards.ep}",
        "--arm",
        "images",
        *_load_flags(config, wildcards),
        "--no-gsm8k",
        *_server_gpu_flags(config, wildcards),
    ]


def compare_settings(config: dict, pins: Any, wildcards: Any) -> str:
    """A comparison's tracked values (a rerun trigger): both images' pins and the shared
    load grid."""
    sides = compare_sides(config, pins, wildcards)
    return shlex.join(_compare_flags(config, wildcards)) + " " + json.dumps(sides, sort_keys=True)


def compare_args(config: dict, pins: Any, wildcards: Any, input: Any) -> str:
    """The whole command line of a comparison. ``--images-json`` names the tuned folders,
    which are inputs, so this is passed untracked; ``compare_settings`` is its tracked twin."""
    sides = compare_sides(config, pins, wildcards)
    sides[0]["tuned_config_dir"] = input.tuned_a
    sides[1]["tuned_config_dir"] = input.tuned_b
    args = _compare_flags(config, wildcards)
    args += ["--images-json", json.dumps(sides), *_server_host_flags(config)]
    return shlex.join(args)


# --- configs --------------------------------------------------------------------------------


def configs_settings(config: dict, pins: Any, cells: list) -> str:
    """The configs job's tracked values: which entries it keeps, its improvement threshold,
    its cells and their images' digests and ROCm versions (the tuner's own flags are not here:
    editing keep or the threshold reruns this job only)."""
    from cellbench.configs.collect import image_facts

    values = {
        "keep": config["tune"]["keep"],
        "min_improvement_pct": float(config["tune"]["min_improvement_pct"]),
        "cells": sorted(c.cell_id for c in cells),
        "images": image_facts(config, pins, [c.image for c in cells]),
    }
    return json.dumps(values, sort_keys=True)


# --- archive --------------------------------------------------------------------------------


def results_hash(config: dict, pins: Any, cells: list) -> str:
    """sha256 over the tracked settings of the given cells' jobs: what the archive records as
    the configuration its results came from. Settings that shape nothing (timeouts, the host
    GPU count, cache folders) are not in it, so editing them archives nothing new."""
    serve_arms = ["pair"] if config["serve"]["interleave_arms"] else list(cbconfig.ARMS)
    parts = [config["gsm8k"].get("local_questions")]
    for c in cells:
        parts.append(tune_settings(config, pins, c))
        parts += [serve_settings(config, pins, c, arm) for arm in serve_arms]
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
