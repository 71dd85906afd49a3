"""The bad-input catalogue's probe type, its config-editing helpers, and its first part:
config values, gates and config artifacts, environment variables (tests/workflow/test_bad_input.py
runs them; docs/bad-input.md shows them)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


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


CONFIG_PROBES: list[Probe] = [
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
        "report.min_change_pct = -1: -1 is less than or equal to the minimum of 0",
        base="local",
        edit=_set("report", {"min_change_pct": -1}),
    ),
    Probe(
        "target-detectable-zero",
        "config",
        "`report.target_detectable_pct: 0`",
        "report.target_detectable_pct = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=_set("report", {"target_detectable_pct": 0}),
    ),
    Probe(
        "target-detectable-negative",
        "config",
        "`report.target_detectable_pct: -3`",
        "report.target_detectable_pct = -3: -3 is less than or equal to the minimum of 0",
        base="local",
        edit=_set("report", {"target_detectable_pct": -3}),
    ),
    Probe(
        "plan-starts-float",
        "config",
        "`plan.max_starts: 4.5` (a count)",
        "plan.max_starts = 4.5: 4.5 is not of type 'integer'",
        base="local",
        edit=_set("plan", {"max_starts": 4.5}),
    ),
    Probe(
        "plan-repeats-float",
        "config",
        "`plan.repeats_per_start_max: 3.0` (a count)",
        "plan.repeats_per_start_max = 3.0: must be an integer, written without a decimal point",
        base="local",
        edit=_set("plan", {"repeats_per_start_max": 3.0}),
    ),
    Probe(
        "plan-repeats-cap-below-min",
        "config",
        "`plan.repeats_per_start_max: 2` with `repeats_per_start_min: 3`",
        "plan.repeats_per_start_max = 2: below plan.repeats_per_start_min = 3",
        base="local",
        edit=_set("plan", {"repeats_per_start_min": 3, "repeats_per_start_max": 2}),
    ),
    Probe(
        "plausible-tpot-zero",
        "config",
        "`serve.min_plausible_tpot_ms: 0`",
        "serve.min_plausible_tpot_ms = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=_set("serve", "min_plausible_tpot_ms", 0),
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
]
