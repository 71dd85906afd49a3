"""The workflow's jobs (what each stage is handed), split into what shapes a result and what
does not.

Snakemake reruns a job when one of its rule's params changes, but only params it can compare:
plain values computed from wildcards and config. A params function that names ``input``,
``output``, ``threads`` or ``resources`` is "derived" and left out of that comparison. So each
measuring rule gets two params built here:

* ``settings`` (tracked): every value that changes the job's output (the model and its
  layout, the load grid, repeats, GSM8K shots, the pinned digest, the GPU vendor ...). Editing
  any of these in the config reruns the job and everything downstream of it. For the tune
  and serve stages it is the stage's job itself, as canonical JSON (``tune_job``,
  ``serve_job``), which the stage reads with ``--job``.
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

from cellbench.common.canonical import canonical
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


# --- tune -----------------------------------------------------------------------------------
#
# A tune job is a dict of ``cellbench.tune.job.TuneJob`` fields: ``tune_job``, tracked as
# canonical JSON (params.settings), which the rule hands to ``python -m cellbench.tune --job``
# through ``cellbench.runtime.steps``; the step's own flags (``step_flags``) stay untracked.
# The config's tune section goes in as it is, but for the keys below.

# tune keys that are the configs rule's, not the tuner's (configs_settings tracks them).
TUNE_RULE_KEYS = ("keep", "min_improvement_pct")


def tune_job(config: dict, pins: Any, wildcards: Any) -> dict[str, Any]:
    """The tune stage's job for a cell: the model's shape, the tune section's settings, and
    where it runs (runtime, pinned digest, GPUs, the cell's variables)."""
    model = config["models"][wildcards.model]
    job = {k: v for k, v in config["tune"].items() if k not in TUNE_RULE_KEYS}
    dtype = model["dtype"]
    if dtype in ("bf16", "fp16", "fp32"):
        # Unquantised: no dtype in vLLM's file name; the activations' dtype is what differs.
        job.update(dtype="none", act_dtype=dtype)
    else:
        job["dtype"] = dtype
    job.update(
        model_config=model.get("model_config") or model_source(config, wildcards.model),
        tp=int(wildcards.tp),
        ep=int(wildcards.ep),
        block_shape=model["block_shape"],
        runtime=config["runtime"],
        image_digest=pins.digest(wildcards.image),
    )
    if config["runtime"] == "docker":
        job.update(gpu_vendor=config["gpu_vendor"], gpus=gpus_per_server(config, wildcards))
    env = cell_env(config, wildcards)
    if env:  # the step sets them; the tuner checks it did
        job["env"] = env
    return job


def tune_settings(config: dict, pins: Any, wildcards: Any) -> str:
    """params.settings of the tune rule (a rerun trigger): ``tune_job`` as canonical JSON."""
    return canonical(tune_job(config, pins, wildcards))


def step_flags(config: dict, pins: Any, wildcards: Any) -> str:
    """``python -m cellbench.runtime.steps`` flags: runtime, image and GPUs (all of which shape the
    result, and are repeated in ``tune_job``), then host details."""
    args = ["--runtime", config["runtime"]]
    # The cell's variables (tracked in tune_job): in the container, or the tuner process's.
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
#
# A serving job is a dict of ``cellbench.serve.job.StageConfig`` fields: ``serve_job`` (tracked,
# as canonical JSON: params.settings) and ``serve_host`` (untracked: params.host). The rule
# passes both to ``python -m cellbench.serve --job ... --host ...``; ``StageConfig.from_job``
# reads them. The config's serve section goes in as it is, but for the keys below.

# serve keys that are not the job's settings: this host's details (serve_host) and which rules
# the workflow has (serve.smk, compare.smk).
SERVE_HOST_KEYS = ("vllm_python", "ready_timeout_s")
SERVE_RULE_KEYS = ("interleave_arms", "compare_images")

# The gsm8k keys a serving job reads, and their StageConfig fields (local_questions makes the
# question file, an input; min_change_pct is the report's).
GSM8K_FIELDS = {
    "num_fewshot": "gsm8k_fewshot",
    "limit": "gsm8k_limit",
    "max_gen_toks": "gsm8k_max_gen_toks",
    "num_concurrent": "gsm8k_concurrency",
    "dataset": "gsm8k_dataset",
    "api": "gsm8k_api",
    "instances": "gsm8k_instances",
}


def local_device(config: dict) -> str:
    """The torch device of the local runtime's servers: a GPU when the config gives it one
    (``gpus``; ROCm's torch names its GPUs ``cuda`` too), else the CPU."""
    return "cuda" if config["gpus"] > 0 else "cpu"


def _server_gpus(config: dict, wildcards: Any) -> dict[str, Any]:
    """The GPUs of a serving job: a container's per server, or on the local runtime the
    config's ``gpus``, which both arms' host processes share (none: the CPU, no keys)."""
    if config["runtime"] == "docker":
        return {"gpu_vendor": config["gpu_vendor"], "gpus": gpus_per_server(config, wildcards)}
    if config["gpus"] == 0:
        return {}
    return {"gpu_vendor": config["gpu_vendor"], "gpus": config["gpus"]}


def _load_job(config: dict, wildcards: Any) -> dict[str, Any]:
    """The model, its layout, the load grid and the serve section's settings: shared by every
    serving job. A gate (max_failed_share) is tracked too: a stricter gate must re-judge
    results that passed the old one."""
    model = config["models"][wildcards.model]
    skip = SERVE_HOST_KEYS + SERVE_RULE_KEYS
    job = {k: v for k, v in config["serve"].items() if k not in skip}
    if not job["request_rates"]:  # they shape request-rate points only: none, no number
        del job["request_rate_prompts"], job["burstiness"]
    job.update(
        model=model_source(config, wildcards.model),
        served_model_name=wildcards.model,
        tp=int(wildcards.tp),
        ep=int(wildcards.ep),
        serve_args=list(model["serve_args"]),
        model_dtype=model["dtype"],
        **_server_gpus(config, wildcards),
    )
    if config["runtime"] == "local":
        job["device"] = local_device(config)
    span = job.pop("starts")
    job["starts_min"], job["starts_cap"] = int(span["min"]), int(span["cap"])
    if job["starts_cap"] > job["starts_min"]:
        # The stopping rule settles a point at the report's margin, so the margin shapes how
        # many starts are measured; without stopping it shapes nothing here (not tracked).
        job["min_change_pct"] = float(config["report"]["min_change_pct"])
    return job


def serve_job(config: dict, pins: Any, wildcards: Any, arm: str) -> dict[str, Any]:
    """The serve stage's tracked job for one arm, or both (``arm="pair"``)."""
    job = {
        "runtime": config["runtime"],
        "cell_id": cell_id(wildcards),
        "arm": arm,
        **_load_job(config, wildcards),
        **{field: config["gsm8k"][key] for key, field in GSM8K_FIELDS.items()},
        "image_digest": pins.digest(wildcards.image),
    }
    if arm != "pair":  # one arm alone has no pairs to stop on: serve.starts.min starts, fixed
        job["starts_cap"] = job["starts_min"]
        job.pop("min_change_pct", None)
    env = cell_env(config, wildcards)
    if env:  # both arms' servers get them
        job["server_env"] = env
    if config["runtime"] == "docker":
        job["image_ref"] = pins.ref(wildcards.image)
    return job


def serve_settings(config: dict, pins: Any, wildcards: Any, arm: str) -> str:
    """params.settings of the serve rules: ``serve_job`` as canonical JSON."""
    return canonical(serve_job(config, pins, wildcards, arm))


def _host_job(config: dict) -> dict[str, Any]:
    """Host details of serving jobs: none of them changes a number."""
    job: dict[str, Any] = {
        "lease_dir": LEASE_DIR,
        "ready_timeout_s": config["serve"]["ready_timeout_s"],
    }
    if config["runtime"] == "local" and config["serve"]["server"] == "vllm":
        # Where vLLM is installed on this host (its own environment): what it serves is
        # tracked through the server and the model, not through the interpreter's path.
        job["vllm_python"] = str(Path(config["serve"]["vllm_python"]).expanduser())
    if config["runtime"] == "docker":
        job["total_gpus"] = config["gpus"]
        job["hf_cache"] = str(Path(config["hf_cache"]).expanduser())
    return job


def serve_host(config: dict, input: Any) -> str:
    """params.host of the serve rules (untracked): host details and the tuned configs' folder
    (whose content is tracked through Snakemake's input triggers)."""
    job = _host_job(config)
    if "tuned" in set(input.keys()):
        job["tuned_config_dir"] = input.tuned
    return canonical(job)


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


def compare_job(config: dict, pins: Any, wildcards: Any) -> dict[str, Any]:
    """A comparison's tracked job: both images' pins and the shared load grid. No capacity
    search runs there, so ``serve.sla`` is left out: editing it reruns no comparison."""
    job = {
        "runtime": config["runtime"],
        "cell_id": f"{wildcards.image_a}-vs-{wildcards.image_b}/{wildcards.model}"
        f"/tp{wildcards.tp}-ep{wildcards.ep}",
        "arm": "images",
        **_load_job(config, wildcards),
        "gsm8k": False,
        "images": compare_sides(config, pins, wildcards),
    }
    job.pop("sla", None)
    return job


def compare_settings(config: dict, pins: Any, wildcards: Any) -> str:
    """params.settings of a comparison (a rerun trigger): ``compare_job`` as canonical JSON."""
    return canonical(compare_job(config, pins, wildcards))


def compare_args(config: dict, pins: Any, wildcards: Any, input: Any) -> str:
    """The whole job of a comparison, host details and each side's tuned folder (inputs)
    included, so passed untracked; ``compare_settings`` is its tracked twin."""
    job = compare_job(config, pins, wildcards)
    job["images"][0]["tuned_config_dir"] = input.tuned_a
    job["images"][1]["tuned_config_dir"] = input.tuned_b
    return canonical({**job, **_host_job(config)})


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


# --- report ---------------------------------------------------------------------------------


def report_settings(config: dict) -> str:
    """The report rule's tracked flags: its verdicts' floor and, when set, the latency bounds
    whose claims it checks (report-side only: an edit reruns the report, no measurement). With
    no bounds the string is what it was before they existed, so no finished run reruns."""
    report = config["report"]
    flags = f"--min-change-pct {report['min_change_pct']}"
    bounds = report.get("latency_bounds")
    if bounds:
        flags += f" --latency-bounds {shlex.quote(canonical(bounds))}"
    return flags
