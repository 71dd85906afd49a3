"""The bad-input catalogue: every probe is refused with its message, and nothing runs.

PROBES below is the catalogue; docs/bad-input.md holds the same table, rendered from it
(`python tests/workflow/test_bad_input.py` rewrites it; a test fails when the two differ). Kinds:

* config: an edit of a shipped config, written to a file and loaded by
`cellbench.config.loader.load`
  in-process (what `snakemake` and `cellbench cells` both call);
* yaml: a config file's text, loaded the same way;
* cli: a `cellbench` command line, run in-process;
* snakemake: a config file given to a real `snakemake -n` (a few, to show the wiring).

Every probe must fail (exit 2 for the CLI, non-zero for Snakemake) with the expected words, and
leave nothing behind: no results/ in a fresh working folder, no tuner output folder.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cellbench import cli
from cellbench.config import loader as cbconfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bad-input.md"
BEGIN, END = "<!-- probes:begin -->", "<!-- probes:end -->"


def _base(name: str) -> dict:
    return yaml.safe_load((ROOT / f"config/{name}.yaml").read_text())


@dataclass(frozen=True)
class Probe:
    id: str
    kind: str  # config | yaml | cli | snakemake
    probe: str  # what the table shows
    expected: str  # words the message must hold
    base: str = "config"  # config | local (config and snakemake kinds)
    edit: Callable[[dict], Any] | None = None
    text: str | None = None  # yaml kind: the file's text; "<missing>" for no file
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    rc: int = 2  # cli kind: the exit status (tidy and archive list say 1 for a bad result)


def _set(*path_and_value):
    *path, value = path_and_value

    def edit(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        if value is DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


def _rename_image(new: str):
    """Rename the local config's image to ``new`` everywhere it is named."""

    def edit(cfg):
        cfg["images"] = {new: cfg["images"].pop("host-cpu")}
        for group in cfg["cells"]:
            group["images"] = [new]

    return edit


def _with_model_config(name: str, path: str, **cells0):
    """Production config: model ``name`` reads ``path`` at plan time; cells[0] edited."""

    def edit(cfg):
        cfg["models"][name]["model_config"] = path
        cfg["cells"][0].update(cells0)

    return edit


ODD = str(ROOT / "tests/data/model_configs/odd-shapes-moe.json")

DELETE = object()
Q30 = "qwen3-30b-a3b-fp8"
SMALL = "runtime: local\nimages:\n  host-cpu:\n    ref: local/host-cpu:none\n"
MOE = str(ROOT / "tests/data/model_configs")

PROBES: list[Probe] = [
    # --- config values (in-process, as snakemake and cellbench cells validate) ---
    Probe(
        "unknown-key",
        "config",
        "`colour: blue` at the top",
        "unknown key 'colour'",
        edit=_set("colour", "blue"),
    ),
    Probe(
        "unknown-nested-key",
        "config",
        "`serve.warmup: 3`",
        "unknown key 'warmup' in serve",
        edit=_set("serve", "warmup", 3),
    ),
    Probe(
        "missing-runtime",
        "config",
        "no `runtime`",
        "'runtime' is a required property",
        edit=_set("runtime", DELETE),
    ),
    Probe(
        "runtime-podman",
        "config",
        "`runtime: podman`",
        'runtime = "podman"',
        edit=_set("runtime", "podman"),
    ),
    Probe("cells-empty", "config", "`cells: []`", "cells = []", edit=_set("cells", [])),
    Probe("models-empty", "config", "`models: {}`", "models = {}", edit=_set("models", {})),
    Probe(
        "undefined-image",
        "config",
        "`cells[0].images: [rocm9.9]`",
        "cells[0].images: image 'rocm9.9' is not defined",
        edit=_set("cells", 0, "images", ["rocm9.9"]),
    ),
    Probe(
        "undefined-model",
        "config",
        "`cells[0].models: [llama]`",
        "cells[0].models: model 'llama' is not defined",
        edit=_set("cells", 0, "models", ["llama"]),
    ),
    Probe(
        "tp-not-power-of-two",
        "config",
        "`cells[0].tp: 3`",
        "cells[0].tp = 3: must be a power of two",
        edit=_set("cells", 0, "tp", 3),
    ),
    Probe(
        "tp-over-gpus",
        "config",
        "`cells[0].tp: 16` with `gpus: 8`",
        "cells[0].tp = 16: exceeds the 8 GPUs configured",
        edit=_set("cells", 0, "tp", 16),
    ),
    Probe(
        "tp-zero", "config", "`cells[0].tp: 0`", "cells[0].tp = 0", edit=_set("cells", 0, "tp", 0)
    ),
    Probe(
        "ep-with-tp1",
        "config",
        "`ep: true` with `tp: 1` (local)",
        "cells[0].ep = true with tp = 1: expert parallel needs more than one rank",
        base="local",
        edit=_set("cells", 0, "ep", True),
    ),
    Probe(
        "interleave-needs-2tp",
        "config",
        "`gpus: 2` with a tp 2 cell (both arms at once)",
        "serve.interleave_arms runs both arms' servers at once",
        edit=_set("gpus", 2),
    ),
    Probe(
        "vendor-none-docker",
        "config",
        "`gpu_vendor: none` with `runtime: docker`",
        'gpu_vendor = "none" with runtime: docker',
        edit=_set("gpu_vendor", "none"),
    ),
    Probe(
        "hf-id-and-build",
        "config",
        "a model with both `hf_id` and `build`",
        "give exactly one of hf_id or build",
        base="local",
        edit=_set("models", "tiny-qwen3-moe", "hf_id", "a/b"),
    ),
    Probe(
        "bad-hf-id",
        "config",
        "`hf_id: not a repo id!`",
        "not a Hugging Face model id",
        edit=_set("models", Q30, "hf_id", "not a repo id!"),
    ),
    Probe(
        "dtype-int3",
        "config",
        "`dtype: int3`",
        f"models.{Q30}.dtype",
        edit=_set("models", Q30, "dtype", "int3"),
    ),
    Probe(
        "block-shape-fp16",
        "config",
        "`block_shape: [128, 128]` with `dtype: fp16`",
        "a block shape applies only to dtype fp8_w8a8",
        base="local",
        edit=_set("models", "tiny-qwen3-moe", "block_shape", [128, 128]),
    ),
    Probe(
        "model-config-missing",
        "config",
        "`model_config: /nonexistent/config.json`",
        "model_config = '/nonexistent/config.json': no such file",
        edit=_set("models", Q30, "model_config", "/nonexistent/config.json"),
    ),
    Probe(
        "serve-args-string",
        "config",
        "`serve_args: --foo` (a string)",
        "is not of type 'array'",
        edit=_set("models", Q30, "serve_args", "--foo"),
    ),
    Probe(
        "serve-args-port",
        "config",
        "`serve_args: [--port, '9000']`",
        "serve_args holds '--port' (as --port): the pipeline sets it",
        edit=_set("models", Q30, "serve_args", ["--port", "9000"]),
    ),
    Probe(
        "serve-args-tp",
        "config",
        "`serve_args: [--tensor-parallel-size=4]`",
        "serve_args holds '--tensor-parallel-size=4' (as --tensor-parallel-size)",
        edit=_set("models", Q30, "serve_args", ["--tensor-parallel-size=4"]),
    ),
    Probe(
        "ref-without-tag",
        "config",
        "`ref: docker.io/rocm/vllm` (no tag)",
        "images.rocm7.0.ref",
        edit=_set("images", "rocm7.0", "ref", "docker.io/rocm/vllm"),
    ),
    Probe(
        "ref-upper-case",
        "config",
        "`ref: docker.io/Rocm/vllm:nightly`",
        "path component 'Rocm' is not a valid image reference",
        edit=_set("images", "rocm7.0", "ref", "docker.io/Rocm/vllm:nightly"),
    ),
    Probe(
        "rocm-version-missing",
        "config",
        "an AMD image without `rocm_version`",
        "images.rocm7.0: rocm_version is required",
        edit=_set("images", "rocm7.0", "rocm_version", DELETE),
    ),
    Probe(
        "run-label-slash",
        "config",
        "`run_label: a/b`",
        'run_label = "a/b"',
        edit=_set("run_label", "a/b"),
    ),
    Probe(
        "image-lock-empty",
        "config",
        "`image_lock: ''`",
        'image_lock = "": must not be empty',
        edit=_set("image_lock", ""),
    ),
    Probe(
        "batch-sizes-empty",
        "config",
        "`tune.batch_sizes: []`",
        "tune.batch_sizes = []",
        edit=_set("tune", "batch_sizes", []),
    ),
    Probe(
        "batch-size-negative",
        "config",
        "`tune.batch_sizes: [1, -4]`",
        "-4",
        edit=_set("tune", "batch_sizes", [1, -4]),
    ),
    Probe(
        "tune-mode",
        "config",
        "`tune.mode: fast`",
        'tune.mode = "fast"',
        edit=_set("tune", "mode", "fast"),
    ),
    Probe(
        "grid-negative",
        "config",
        "`serve.grid[0].isl: -512`",
        "serve.grid[0].isl = -512",
        edit=lambda c: c["serve"]["grid"][0].update(isl=-512),
    ),
    Probe(
        "grid-duplicate",
        "config",
        "the same ISL/OSL point twice in `serve.grid`",
        "the same point as serve.grid[0]",
        edit=lambda c: c["serve"]["grid"].append({"isl": 512, "osl": 512}),
    ),
    Probe(
        "concurrency-duplicate",
        "config",
        "`serve.concurrency: [16, 16]`",
        "16 is listed twice",
        edit=_set("serve", "concurrency", [16, 16]),
    ),
    Probe(
        "repeats-zero",
        "config",
        "`serve.repeats: 0`",
        "serve.repeats = 0",
        edit=_set("serve", "repeats", 0),
    ),
    Probe(
        "failed-share-over-1",
        "config",
        "`serve.max_failed_share: 1.5`",
        "serve.max_failed_share = 1.5",
        edit=_set("serve", "max_failed_share", 1.5),
    ),
    Probe(
        "failed-share-nan",
        "config",
        "`serve.max_failed_share: .nan`",
        "serve.max_failed_share = nan: must be a finite number",
        edit=_set("serve", "max_failed_share", float("nan")),
    ),
    Probe(
        "timeout-inf",
        "config",
        "`serve.ready_timeout_s: .inf`",
        "serve.ready_timeout_s = inf: must be a finite number",
        edit=_set("serve", "ready_timeout_s", float("inf")),
    ),
    Probe(
        "compare-one-image",
        "config",
        "`serve.compare_images: true` with one image",
        "serve.compare_images = true needs at least 2 images",
        base="local",
        edit=_set("serve", "compare_images", True),
    ),
    Probe(
        "limit-over-questions",
        "config",
        "`gsm8k.limit: 100` with 40 local questions",
        "gsm8k.limit = 100: more than the 40 questions generated",
        base="local",
        edit=_set("gsm8k", "limit", 100),
    ),
    Probe(
        "gsm8k-instances-zero",
        "config",
        "`gsm8k.instances: 0`",
        "gsm8k.instances = 0: 0 is less than the minimum of 1",
        base="local",
        edit=_set("gsm8k", "instances", 0),
    ),
    Probe(
        "gsm8k-api-unknown",
        "config",
        "`gsm8k.api: chatml`",
        "gsm8k.api = \"chatml\": 'chatml' is not one of ['auto', 'chat', 'completions']",
        base="local",
        edit=_set("gsm8k", "api", "chatml"),
    ),
    Probe(
        "gsm8k-dataset-missing",
        "config",
        "`gsm8k.dataset: /nope/gsm8k.jsonl` (no local set generated)",
        "gsm8k.dataset = '/nope/gsm8k.jsonl': no such JSONL file",
        base="local",
        edit=lambda cfg: cfg["gsm8k"].update(dataset="/nope/gsm8k.jsonl", local_questions=0),
    ),
    # --- gates, config artifacts, verdicts ---
    Probe(
        "gate-floor-above-one",
        "config",
        "`models.*.gsm8k_gate.floor: 1.5`",
        "models.tiny-qwen3-moe.gsm8k_gate.floor = 1.5: 1.5 is greater than the maximum of 1",
        base="local",
        edit=_set("models", "tiny-qwen3-moe", "gsm8k_gate", {"floor": 1.5}),
    ),
    Probe(
        "gates-on-failure-unknown",
        "config",
        "`gates.on_failure: stop`",
        "gates.on_failure = \"stop\": 'stop' is not one of ['fail', 'continue']",
        base="local",
        edit=_set("gates", {"on_failure": "stop"}),
    ),
    Probe(
        "tune-keep-unknown",
        "config",
        "`tune.keep: best`",
        "tune.keep = \"best\": 'best' is not one of ['all', 'improved']",
        base="local",
        edit=_set("tune", "keep", "best"),
    ),
    Probe(
        "report-floor-negative",
        "config",
        "`report.min_change_pct: -1`",
        "report.min_change_pct = -1: -1 is less than the minimum of 0",
        base="local",
        edit=_set("report", {"min_change_pct": -1}),
    ),
    # --- environment variables (images.*.env, models.*.env, cells[*].env) ---
    Probe(
        "env-unquoted-number",
        "config",
        "`cells[0].env: {VLLM_ROCM_USE_AITER: 0}` (unquoted: YAML reads a number)",
        "cells[0].env.VLLM_ROCM_USE_AITER = 0: YAML read the value as a number; quote it "
        '(VLLM_ROCM_USE_AITER: "0")',
        edit=_set("cells", 0, "env", {"VLLM_ROCM_USE_AITER": 0}),
    ),
    Probe(
        "env-boolean",
        "config",
        f"`models.{Q30}.env: {{VLLM_USE_V1: true}}`",
        f"models.{Q30}.env.VLLM_USE_V1 = true: YAML read the value as a boolean",
        edit=_set("models", Q30, "env", {"VLLM_USE_V1": True}),
    ),
    Probe(
        "env-no-value",
        "config",
        "`cells[0].env: {VLLM_ROCM_USE_AITER: }` (no value)",
        'cells[0].env.VLLM_ROCM_USE_AITER has no value: give a string ("" for an empty one)',
        edit=_set("cells", 0, "env", {"VLLM_ROCM_USE_AITER": None}),
    ),
    Probe(
        "env-hf-token",
        "config",
        '`images.rocm7.0.env: {HF_TOKEN: "hf_..."}`',
        "images.rocm7.0.env.HF_TOKEN: looks like a secret, refused in favour of the "
        "pass-through list",
        edit=_set("images", "rocm7.0", "env", {"HF_TOKEN": "hf_abc"}),
    ),
    Probe(
        "env-api-key",
        "config",
        f'`models.{Q30}.env: {{OPENAI_API_KEY: "sk-..."}}`',
        "cellbench.common.secrets.SECRET_ENV (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HUGGINGFACE_TOKEN)",
        edit=_set("models", Q30, "env", {"OPENAI_API_KEY": "sk-abc"}),
    ),
    Probe(
        "env-password",
        "config",
        '`cells[0].env: {REGISTRY_PASSWORD_FILE: "/run/pw"}`',
        "cells[0].env.REGISTRY_PASSWORD_FILE: looks like a secret",
        edit=_set("cells", 0, "env", {"REGISTRY_PASSWORD_FILE": "/run/pw"}),
    ),
    Probe(
        "env-tuned-folder",
        "config",
        '`cells[0].env: {VLLM_TUNED_CONFIG_FOLDER: "/configs"}`',
        "cells[0].env.VLLM_TUNED_CONFIG_FOLDER: the pipeline sets it per arm",
        edit=_set("cells", 0, "env", {"VLLM_TUNED_CONFIG_FOLDER": "/configs"}),
    ),
    Probe(
        "env-bad-name",
        "config",
        '`images.rocm7.2.env: {VLLM-ROCM: "0"}`',
        "images.rocm7.2.env: variable name 'VLLM-ROCM' is not valid",
        edit=_set("images", "rocm7.2", "env", {"VLLM-ROCM": "0"}),
    ),
    Probe(
        "env-not-mapping",
        "config",
        '`cells[0].env: ["VLLM_ROCM_USE_AITER=0"]`',
        'cells[0].env = ["VLLM_ROCM_USE_AITER=0"]: must be a mapping of variable names',
        edit=_set("cells", 0, "env", ["VLLM_ROCM_USE_AITER=0"]),
    ),
    Probe(
        "env-groups-disagree",
        "config",
        '`cells[1]`: a copy of `cells[0]` with `env: {VLLM_ROCM_USE_AITER: "1"}`',
        "cells[1].env.VLLM_ROCM_USE_AITER = '1' and cells[0].env.VLLM_ROCM_USE_AITER = '0' "
        "both apply to cell rocm7.0/qwen3-30b-a3b-fp8/tp2-ep2",
        edit=lambda c: c["cells"].append({**c["cells"][0], "env": {"VLLM_ROCM_USE_AITER": "1"}}),
    ),
    # --- issue 30: names that collide with the results layout ---
    *[
        Probe(
            f"image-named-{name}",
            "config",
            f"an image named `{name}` (results/{name}/ is the pipeline's own folder)",
            f"images.{name}: results/{name}/ is one of the pipeline's own folders",
            base="local",
            edit=_rename_image(name),
        )
        for name in ("report", "archive", "logs", "configs", "gates", "Compare")
    ],
    # --- issue 30: integer settings written as floats (JSON Schema alone calls 3.0 an int) ---
    *[
        Probe(
            f"float-{key.replace('.', '-').replace('[', '').replace(']', '')}",
            "config",
            f"`{key}: {shown}`",
            f"{key} = {shown}: must be an integer, written without a decimal point ({whole})",
            base=base,
            edit=edit,
        )
        for key, shown, whole, base, edit in (
            ("serve.repeats", "3.0", "3", "config", _set("serve", "repeats", 3.0)),
            ("cells[0].tp", "2.0", "2", "config", _set("cells", 0, "tp", 2.0)),
            ("gpus", "8.0", "8", "config", _set("gpus", 8.0)),
            ("tune.batch_sizes[1]", "16.0", "16", "local", _set("tune", "batch_sizes", [1, 16.0])),
            ("serve.concurrency[0]", "16.0", "16", "config", _set("serve", "concurrency", [16.0])),
            ("gsm8k.num_fewshot", "5.0", "5", "config", _set("gsm8k", "num_fewshot", 5.0)),
            ("gsm8k.limit", "10.0", "10", "local", _set("gsm8k", "limit", 10.0)),
            ("tune.max_configs", "6.0", "6", "local", _set("tune", "max_configs", 6.0)),
            (
                "serve.grid[0].isl",
                "512.0",
                "512",
                "config",
                lambda c: c["serve"]["grid"][0].update(isl=512.0),
            ),
            (
                "serve.prompts_per_concurrency",
                "10.0",
                "10",
                "config",
                _set("serve", "prompts_per_concurrency", 10.0),
            ),
        )
    ],
    # --- issue 30: reserved server options in the spellings vLLM's parser also takes ---
    *[
        Probe(
            f"serve-args-{i}",
            "config",
            f"`serve_args: {args}`",
            f"models.{Q30}.serve_args holds {shown!r} (as {option}): the pipeline sets it",
            edit=_set("models", Q30, "serve_args", args),
        )
        for i, (args, shown, option) in enumerate(
            (
                (
                    ["--tensor_parallel_size", "4"],
                    "--tensor_parallel_size",
                    "--tensor-parallel-size",
                ),
                (
                    ["--tensor_parallel_size=4"],
                    "--tensor_parallel_size=4",
                    "--tensor-parallel-size",
                ),
                (
                    ["--enable_expert_parallel"],
                    "--enable_expert_parallel",
                    "--enable-expert-parallel",
                ),
                (
                    ["--no-enable-expert-parallel"],
                    "--no-enable-expert-parallel",
                    "--no-enable-expert-parallel",
                ),
                (["--served_model_name", "x"], "--served_model_name", "--served-model-name"),
                (["--port=8001"], "--port=8001", "--port"),
                (["-tp=4"], "-tp=4", "-tp"),
                (["-tp4"], "-tp4", "-tp"),
                (["--tensor-parallel", "4"], "--tensor-parallel", "--tensor-parallel-size"),
                (["--model=other/model"], "--model=other/model", "--model"),
            )
        )
    ],
    # --- issue 30: secret-looking variable names beyond *_TOKEN / *_KEY ---
    *[
        Probe(
            f"env-secret-{name.lower().replace('_', '-')}",
            "config",
            f'`cells[0].env: {{{name}: "..."}}`',
            f"cells[0].env.{name}: looks like a secret, refused in favour of the pass-through list",
            edit=_set("cells", 0, "env", {name: "x"}),
        )
        for name in (
            "GITHUB_PAT",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AZURE_CLIENT_SECRET",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "DB_PASS",
            "WANDB_API_KEY",
            "NPM_AUTHTOKEN",
            "DOCKER_AUTH_CONFIG",
            "PIP_PASSPHRASE",
            "ssh_private_key_file",
        )
    ],
    # --- issue 30: shapes `cellbench shapes` refuses, now refused by the config ---
    Probe(
        "shape-ep-experts",
        "config",
        "60 experts (`model_config`) with `tp: 8, ep: true` (EP size does not divide them)",
        f"cells[0]: model {Q30!r} at tp = 8, ep = true: num_experts=60 is not divisible by the "
        "expert-parallel size 8",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=8)(c), c.update(gpus=16)),
    ),
    Probe(
        "shape-block-n",
        "config",
        "block `[128, 128]` with per-rank N 125 (`tp: 8`, no EP)",
        f"cells[0]: model {Q30!r} at tp = 8: block_shape n=128 does not divide per-rank N=125",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=8, ep=False)(c), c.update(gpus=16)),
    ),
    Probe(
        "shape-n-over-tp",
        "config",
        "intermediate size 1000 with `tp: 16`",
        f"cells[0]: model {Q30!r} at tp = 16: moe_intermediate_size=1000 is not divisible by tp=16",
        edit=lambda c: (_with_model_config(Q30, ODD, tp=16, ep=False)(c), c.update(gpus=32)),
    ),
    Probe(
        "shape-block-k",
        "config",
        "block `[128, 96]` on Qwen3-30B-A3B (K 2048 is not a multiple of 96)",
        f"cells[0]: model {Q30!r} at tp = 2, ep = true: block_shape k=96 does not divide "
        "hidden_size K=2048",
        edit=lambda c: (
            _with_model_config(Q30, f"{MOE}/qwen3-30b-a3b-fp8.json")(c),
            c["models"][Q30].update(block_shape=[128, 96]),
        ),
    ),
    Probe(
        "model-config-folder-without-json",
        "config",
        "`model_config:` a folder without config.json",
        f"models.{Q30}.model_config = '{MOE}': a folder without config.json",
        edit=_set("models", Q30, "model_config", MOE),
    ),
    Probe(
        "model-config-not-json-config",
        "config",
        "`model_config:` a file that is not JSON (pyproject.toml)",
        f"models.{Q30}.model_config = '{ROOT}/pyproject.toml': model config {ROOT}/pyproject.toml"
        " is not valid JSON",
        edit=_set("models", Q30, "model_config", str(ROOT / "pyproject.toml")),
    ),
    Probe(
        "model-config-dense",
        "config",
        "`model_config:` a dense model's config.json",
        f"cells[0]: model {Q30!r} at tp = 2, ep = true: model config has no expert-count field",
        edit=_set("models", Q30, "model_config", f"{MOE}/qwen3-dense.json"),
    ),
    # --- issue 30: ISL + OSL beyond the model's context ---
    Probe(
        "context-built-model",
        "config",
        "`serve.grid: [{isl: 4000, osl: 200}]` for the built tiny models (context 4096)",
        "serve.grid[0] = {isl: 4000, osl: 200}: isl + osl = 4200 exceeds model "
        "'tiny-qwen3-moe''s context of 4096 tokens (max_position_embeddings = 4096 in "
        "models.tiny-qwen3-moe.build 'tiny-qwen3-moe'); expected isl + osl <= 4096",
        base="local",
        edit=_set("serve", "grid", [{"isl": 4000, "osl": 200}]),
    ),
    Probe(
        "context-max-model-len",
        "config",
        "`serve_args: [--max-model-len, '8192']` with the default grid (8192 + 1024)",
        "serve.grid[4] = {isl: 8192, osl: 1024}: isl + osl = 9216 exceeds model "
        f"'{Q30}''s context of 8192 tokens (models.{Q30}.serve_args --max-model-len 8192)",
        edit=_set("models", Q30, "serve_args", ["--max-model-len", "8192"]),
    ),
    Probe(
        "context-max-model-len-underscore",
        "config",
        "`serve_args: [--max_model_len=4096]` with the default grid",
        "serve.grid[3] = {isl: 4096, osl: 4096}: isl + osl = 8192 exceeds model",
        edit=_set("models", Q30, "serve_args", ["--max_model_len=4096"]),
    ),
    Probe(
        "context-model-config",
        "config",
        "a `model_config` whose context is 8192, with the default grid",
        "isl + osl = 9216 exceeds model 'qwen3.5-35b-a3b-fp8''s context of 8192 tokens "
        "(max_position_embeddings = 8192 in models.qwen3.5-35b-a3b-fp8.model_config",
        edit=lambda c: c["models"]["qwen3.5-35b-a3b-fp8"].update(
            model_config=ODD, serve_args=[], block_shape=None, dtype="bf16"
        ),
    ),
    # --- issue 33 item 6: a one-of key missing names every alternative ---
    Probe(
        "model-neither-hf-id-nor-build",
        "config",
        "a model with neither `hf_id` nor `build` (local)",
        "models.tiny-qwen3-moe: give one of hf_id or build (none is set)",
        base="local",
        edit=_set("models", "tiny-qwen3-moe", "build", DELETE),
    ),
    Probe(
        "model-neither-production",
        "config",
        f"`models.{Q30}` without `hf_id` (production)",
        f"models.{Q30}: give one of hf_id or build (none is set)",
        edit=_set("models", Q30, "hf_id", DELETE),
    ),
    # --- the file itself ---
    Probe(
        "file-missing", "yaml", "`--configfile` names no file", "does not exist", text="<missing>"
    ),
    Probe("file-empty", "yaml", "an empty file", "the configuration is empty", text=""),
    Probe(
        "yaml-syntax",
        "yaml",
        "an unclosed `[` on line 2",
        "line 3, column 1: not valid YAML",
        text="runtime: local\nimages: [a\n",
    ),
    Probe(
        "yaml-tab",
        "yaml",
        "a tab indenting line 2",
        "line 2, column 1: not valid YAML",
        text="serve:\n\trepeats: 3\n",
    ),
    Probe(
        "yaml-top-level-list",
        "yaml",
        "a list at the top level",
        "the top level must be a mapping",
        text="- runtime: local\n",
    ),
    Probe(
        "duplicate-key",
        "yaml",
        "`runtime:` on lines 1 and 5",
        "line 5: duplicate key 'runtime' (first at line 1)",
        text=SMALL + "runtime: docker\n",
    ),
    Probe(
        "duplicate-nested-key",
        "yaml",
        "`repeats:` twice under `serve:`",
        "line 3: duplicate key 'repeats' (first at line 2)",
        text="serve:\n  repeats: 3\n  repeats: 5\n",
    ),
    Probe(
        "numeric-image-name",
        "yaml",
        "an image named `7.0:` (YAML reads a number)",
        'images: the name 7.0 was read as a number; quote it ("7.0")',
        text="runtime: docker\nimages:\n  7.0:\n    ref: a/b:c\n"
        "models: {m: {hf_id: a/b}}\ncells: [{images: ['7.0'], models: [m], tp: 1}]\n",
    ),
    # --- the cellbench command line ---
    Probe(
        "shapes-ep-tp1",
        "cli",
        "`cellbench shapes --tp 1 --ep`",
        "--ep with --tp 1: expert parallel needs more than one rank",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--tp", "1", "--ep"),
    ),
    Probe(
        "tune-ep-tp1",
        "cli",
        "`cellbench tune --tp 1 --ep`",
        "--ep with --tp 1: expert parallel needs more than one rank",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--tp",
            "1",
            "--ep",
            "--out",
            "{tmp}/tune-out",
        ),
    ),
    Probe(
        "shapes-device-slash",
        "cli",
        "`cellbench shapes --device-name a/b`",
        "--device-name 'a/b': it becomes part of a file name, so it may hold only letters",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--device-name", "a/b"),
    ),
    Probe(
        "tune-device-comma",
        "cli",
        "`cellbench tune --device-name 'MI300,X'`",
        "--device-name 'MI300,X': it becomes part of a file name",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--device-name",
            "MI300,X",
            "--out",
            "{tmp}/tune-out",
        ),
    ),
    Probe(
        "shapes-tp0",
        "cli",
        "`cellbench shapes --tp 0`",
        "--tp=0 must be >= 1",
        argv=("shapes", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--tp", "0"),
    ),
    Probe(
        "model-config-missing-cli",
        "cli",
        "`cellbench shapes --model-config` a missing file",
        "model config not found: /nonexistent/config.json",
        argv=("shapes", "--model-config", "/nonexistent/config.json"),
    ),
    Probe(
        "model-config-not-json",
        "cli",
        "a model config that is not JSON",
        "is not valid JSON",
        argv=("shapes", "--model-config", "{tmp}/broken.json"),
    ),
    Probe(
        "model-not-moe",
        "cli",
        "a dense (non-MoE) model config",
        "dense.json: model config has no expert-count field",
        argv=("shapes", "--model-config", "{tmp}/dense.json"),
    ),
    Probe(
        "hub-unreachable",
        "cli",
        "a hub id while the hub cannot be reached (offline)",
        "could not fetch config.json of 'nosuchorg/nosuchmodel' from the Hugging Face hub",
        argv=("shapes", "--model-config", "nosuchorg/nosuchmodel"),
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "{tmp}/hf"},
    ),
    Probe(
        "tune-batch-sizes",
        "cli",
        "`cellbench tune --batch-sizes 1,x`",
        "--batch-sizes: 'x' is not an integer",
        argv=("tune", "--model-config", "x", "--batch-sizes", "1,x", "--out", "{tmp}/tune-out"),
    ),
    Probe(
        "tune-compile-budget",
        "cli",
        "`cellbench tune --compile-budget 3`",
        "--compile-budget='3': expected FIRST,LATER",
        argv=("tune", "--model-config", "x", "--compile-budget", "3", "--out", "{tmp}/t"),
    ),
    Probe(
        "cells-missing-config",
        "cli",
        "`cellbench cells --configfile missing.yaml`",
        "config file 'missing.yaml' does not exist",
        argv=("cells", "--configfile", "missing.yaml"),
    ),
    Probe(
        "images-on-local",
        "cli",
        "`cellbench images status` (default config/local.yaml)",
        "has runtime: local, which runs no image, so there is nothing to pin",
        argv=("images", "status"),
    ),
    Probe(
        "images-bump-unknown",
        "cli",
        "`cellbench images bump rocm9.9`",
        "image 'rocm9.9' is not defined under images",
        argv=("images", "bump", "rocm9.9", "--configfile", "config/config.yaml"),
    ),
    Probe(
        "unknown-command",
        "cli",
        "`cellbench frobnicate`",
        "unknown command 'frobnicate'",
        argv=("frobnicate",),
    ),
    # --- issue 30: bad CLI values and unusable paths: one line, no traceback ---
    *[
        Probe(
            f"tune-time-budget-{name}",
            "cli",
            f"`cellbench tune --time-budget-s {value}`",
            f"--time-budget-s={shown} must be a number of seconds > 0",
            argv=(
                "tune",
                "--model-config",
                f"{MOE}/qwen3-30b-a3b.json",
                "--time-budget-s",
                value,
                "--out",
                "{tmp}/tune-out",
            ),  # fmt: skip
        )
        for name, value, shown in (
            ("negative", "-1", "-1"),
            ("zero", "0", "0"),
            ("nan", "nan", "nan"),
            ("inf", "inf", "inf"),
        )  # fmt: skip
    ],
    Probe(
        "tune-compile-workers-negative",
        "cli",
        "`cellbench tune --compile-workers -2`",
        "--compile-workers=-2 must be >= 0",
        argv=(
            "tune",
            "--model-config",
            f"{MOE}/qwen3-30b-a3b.json",
            "--compile-workers",
            "-2",
            "--out",
            "{tmp}/tune-out",
        ),  # fmt: skip
    ),
    Probe(
        "tune-out-under-a-file",
        "cli",
        "`cellbench tune --out /dev/null/tune` (a path below a file)",
        "--out /dev/null/tune: /dev/null is not a folder (expected a folder to write into)",
        argv=("tune", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--out", "/dev/null/tune"),
    ),
    Probe(
        "tune-out-is-a-file",
        "cli",
        "`cellbench tune --out FILE` (an existing file)",
        "--out {tmp}/a-file: --out itself is not a folder",
        argv=("tune", "--model-config", f"{MOE}/qwen3-30b-a3b.json", "--out", "{tmp}/a-file"),
    ),
    Probe(
        "tidy-out-dir-under-a-file",
        "cli",
        "`cellbench tidy ARCHIVED_RUN --out-dir /dev/null/t` on a damaged run",
        "an archive manifest",
        argv=(
            "tidy",
            "{tmp}/archive/embedded-cpu/20261205T000000Z-local",
            "--out-dir",
            "/dev/null/t",
        ),  # fmt: skip
        rc=1,
    ),
    Probe(
        "tidy-out-dir-unwritable",
        "cli",
        "`cellbench tidy results --out-dir /dev/null/t` (a path below a file)",
        "cellbench tidy: error: cannot write --out-dir /dev/null/t: Not a directory",
        argv=("tidy", "{tmp}/results", "--out-dir", "/dev/null/t"),
        rc=1,
    ),
    Probe(
        "tidy-not-a-folder",
        "cli",
        "`cellbench tidy FILE`",
        "{tmp}/a-file: not a folder (expected results/ or an archived run)",
        argv=("tidy", "{tmp}/a-file"),
        rc=1,
    ),
    Probe(
        "archive-list-damaged-run",
        "cli",
        "`cellbench archive list` with a run whose MANIFEST.json is cut short",
        "1 run(s) with an unreadable MANIFEST.json: embedded-cpu/20261205T000000Z-local; check "
        "them: cellbench archive verify RUN",
        argv=("archive", "list", "--archive-root", "{tmp}/archive"),
        rc=1,
    ),
    Probe(
        "archive-show-missing-run",
        "cli",
        "`cellbench archive show nosuch/run`",
        "nosuch",
        argv=("archive", "show", "nosuch/run", "--archive-root", "{tmp}/archive"),
    ),
    # --- through a real `snakemake -n`: the same messages where the user looks ---
    Probe(
        "snakemake-duplicate-key",
        "snakemake",
        "`snakemake -n` on a file with `runtime:` twice",
        "duplicate key 'runtime'",
        base="local",
        edit=lambda c: None,
        text="runtime: docker\n",
    ),
    Probe(
        "snakemake-ep-tp1",
        "snakemake",
        "`snakemake -n` with `ep: true`, `tp: 1`",
        "cells[0].ep = true with tp = 1: expert parallel needs more than one rank",
        base="local",
        edit=_set("cells", 0, "ep", True),
    ),
    Probe(
        "snakemake-grid",
        "snakemake",
        "`snakemake -n` with `serve.grid[1].isl: -1024`",
        "serve.grid[1].isl = -1024",
        edit=lambda c: c["serve"]["grid"][1].update(isl=-1024),
    ),
    Probe(
        "snakemake-image-named-report",
        "snakemake",
        "`snakemake -n` with the image named `report`",
        "images.report: results/report/ is one of the pipeline's own folders",
        base="local",
        edit=_rename_image("report"),
    ),
    Probe(
        "snakemake-repeats-float",
        "snakemake",
        "`snakemake -n` with `serve.repeats: 3.0`",
        "serve.repeats = 3.0: must be an integer, written without a decimal point (3)",
        base="local",
        edit=_set("serve", "repeats", 3.0),
    ),
    Probe(
        "snakemake-yaml-syntax",
        "snakemake",
        "`snakemake -n` on a file that is not YAML (Snakemake reads it before cellbench: "
        "its own message, without file or line; `cellbench cells --configfile F` names both)",
        "Config file is not valid JSON or YAML",
        text="runtime: local\nimages: [a\n",
    ),
]


def _fill(value: str, tmp: Path) -> str:
    return value.replace("{tmp}", str(tmp))


def _config_file(probe: Probe, tmp: Path) -> Path:
    path = tmp / f"{probe.id}.yaml"
    if probe.kind == "yaml":
        if probe.text != "<missing>":
            path.write_text(probe.text)
        return path
    if probe.edit is None:  # text only: a file that is not YAML
        path.write_text(probe.text)
        return path
    cfg = copy.deepcopy(_base(probe.base))
    probe.edit(cfg)
    # NaN and infinity as YAML writes them (.nan, .inf), so the file is what a user writes
    path.write_text(yaml.safe_dump(cfg, sort_keys=False) + (probe.text or ""))
    return path


def _prepare_cli_inputs(tmp: Path) -> None:
    (tmp / "broken.json").write_text("{not json")
    (tmp / "a-file").write_text("not a folder\n")
    # An archive whose one run lost its manifest's end (a copy cut short).
    run = tmp / "archive" / "embedded-cpu" / "20261205T000000Z-local"
    run.mkdir(parents=True, exist_ok=True)
    (run / "MANIFEST.json").write_text('{"label": "embedded-cpu", "cel')
    # One whole cell of live results, for commands that read them.
    from support import result_fixtures as fx

    cell = "host-cpu/tiny-qwen3-moe/tp1-ep1"
    fx.write_tune(tmp / "results", cell)
    for arm in ("untuned", "tuned"):
        fx.write_bench(tmp / "results", cell, arm, [fx.point()])
        fx.write_gsm8k(tmp / "results", cell, arm, [True, False])
    (tmp / "dense.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128})
    )


def run_probe(probe: Probe, tmp: Path, capsys, monkeypatch) -> str:
    """The probe's message; asserts it was refused."""
    if probe.kind in ("config", "yaml"):
        path = _config_file(probe, tmp)
        with pytest.raises(cbconfig.ConfigError) as err:
            cbconfig.load(path)
        return str(err.value)
    if probe.kind == "cli":
        _prepare_cli_inputs(tmp)
        for key, value in probe.env.items():
            monkeypatch.setenv(key, _fill(value, tmp))
        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        rc = cli.main([_fill(a, tmp) for a in probe.argv])
        out = capsys.readouterr()
        assert rc == probe.rc, (rc, out)
        assert not (tmp / "tune-out").exists() and not (tmp / "t").exists()
        return out.err
    assert probe.kind == "snakemake", probe.kind
    path = _config_file(probe, tmp)
    work = tmp / "work"
    work.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "all",  # targets before --configfile, which takes every word after it
            "-n",
            "--cores",
            "1",
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")},
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (work / "results").exists()
    return proc.stdout + proc.stderr


def _md_cell(text: str) -> str:
    # The checkout's own path varies by machine; the table shows it as {repo}.
    text = text.replace(str(ROOT), "{repo}")
    return text.replace("|", "\\|").replace("\n", " ")


def render_table() -> str:
    rows = ["| # | Kind | Probe | Message holds |", "|---|---|---|---|"]
    for i, p in enumerate(PROBES, 1):
        rows.append(f"| {i} | {p.kind} | {_md_cell(p.probe)} | `{_md_cell(p.expected)}` |")
    return "\n".join(rows)


def _doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"{DOC}: no table between {BEGIN} and {END}"
    return match.group(1)


def test_catalogue_size_and_ids():
    assert len(PROBES) >= 100
    assert len({p.id for p in PROBES}) == len(PROBES)


def test_doc_table_is_the_catalogue():
    assert _doc_table() == render_table(), (
        "docs/bad-input.md and PROBES differ: run `python tests/workflow/test_bad_input.py`"
    )


FAST = [p for p in PROBES if p.kind != "snakemake"]
SLOW = [p for p in PROBES if p.kind == "snakemake"]


@pytest.mark.parametrize("probe", FAST, ids=[p.id for p in FAST])
def test_probe_is_refused_by_name(probe, tmp_path, capsys, monkeypatch):
    message = run_probe(probe, tmp_path, capsys, monkeypatch)
    expected = _fill(probe.expected, tmp_path)
    assert expected in message, f"{expected!r} not in {message!r}"
    assert "Traceback" not in message
    if probe.kind in ("config", "yaml") and probe.text != "<missing>":
        # one line; a file fault names the file
        assert "\n" not in message.strip(), message
        if re.search(r"\bline \d|top level", probe.expected):  # a fault of the file itself
            assert str(tmp_path / f"{probe.id}.yaml") in message, message


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "VLLM_ROCM_USE_AITER", "KEYBOARD_LAYOUT", "PASSES", "PATH_X"]
)
def test_near_miss_variable_names_are_not_taken_for_secrets(name, tmp_path):
    """The secret rule works on whole words: these hold no credential and stay allowed."""
    cfg = copy.deepcopy(_base("local"))
    cfg["cells"][0]["env"] = {name: "1"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cbconfig.load(path)["cells"][0]["env"] == {name: "1"}


def test_shipped_configs_pass_the_new_checks():
    """The layout, integer, serve_args, shape and context checks refuse none of the shipped
    configs (the production models' --max-model-len 65536 holds the default grid)."""
    for name in ("config", "local", "gpu-local", "local-vllm"):
        if (ROOT / f"config/{name}.yaml").is_file() and name != "local-vllm":
            cbconfig.load(ROOT / f"config/{name}.yaml")


def test_values_of_a_serve_arg_are_not_options():
    """Negative numbers and plain values after an option are not read as reserved options."""
    assert cbconfig.reserved_serve_option("-1") is None
    assert cbconfig.reserved_serve_option("0.95") is None
    assert cbconfig.reserved_serve_option("--max-model-len") is None
    assert cbconfig.reserved_serve_option("--model-impl") is None
    assert cbconfig.reserved_serve_option("--tensor_parallel_size") == "--tensor-parallel-size"


@pytest.mark.slow
@pytest.mark.parametrize("probe", SLOW, ids=[p.id for p in SLOW])
def test_probe_through_snakemake(probe, tmp_path, capsys, monkeypatch):
    message = run_probe(probe, tmp_path, capsys, monkeypatch)
    assert probe.expected in message, f"{probe.expected!r} not in {message!r}"


if __name__ == "__main__":  # rewrite the table in docs/bad-input.md from PROBES
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{render_table()}\n{END}{tail}", encoding="utf-8")
    print(f"wrote {len(PROBES)} probes to {DOC}")
