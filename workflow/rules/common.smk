# Config validation, the cell model and input functions shared by every stage.
import json
import os
import time
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))
from cellbench import config as cbconfig  # noqa: E402
from cellbench import pins  # noqa: E402

try:
    cbconfig.validate(config)
except cbconfig.ConfigError as exc:
    raise WorkflowError(str(exc)) from None
validate(config, schema="../schemas/config.schema.yaml")

CELLS = cbconfig.cells(config)
# serve.compare_images: image-vs-image comparisons interleaved on one host (an extra aggregate).
COMPARISONS = cbconfig.comparisons(config) if config["serve"]["compare_images"] else []
# Containers are labelled with the run that started them (cellbench.run).
os.environ.setdefault(
    "CELLBENCH_RUN_ID", time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
)
ARMS = cbconfig.ARMS
RUNTIME = config["runtime"]
# Every rule names workflow/envs/cellbench.yaml. With `--sdm conda` jobs run in that
# environment and import cellbench from this tree; otherwise they call `python`, the
# interpreter Snakemake runs under, wherever its environment lives.
HOST_ENV = "../envs/cellbench.yaml"
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    PYTHON_HOST = "python"
    _code = shlex.quote(str(Path(workflow.basedir) / "workflow"))
    # (braces doubled twice: once for this f-string, once for Snakemake's own formatting)
    shell.prefix(f"export PYTHONPATH={_code}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")
else:
    PYTHON_HOST = sys.executable
    shell.prefix(f"export PATH={shlex.quote(os.path.dirname(sys.executable))}:$PATH; ")
PINS = pins.Pins.for_config(config)
if PINS.unpinned():
    # The plan is still shown (and `-n` stays useful); the jobs themselves refuse to run a tag.
    logger.warning(
        f"images not pinned in {config['image_lock']}: {', '.join(PINS.unpinned())}; "
        "their jobs will refuse to start until `cellbench images lock` pins them"
    )
# On the local runtime, steps that time things take every core (Snakemake caps threads at
# --cores), so no other job perturbs their measurements; containerised steps time on GPUs.
MEASURING_THREADS = 1024 if RUNTIME == "local" else 1


wildcard_constraints:
    image="|".join(re.escape(name) for name in config["images"]),
    image_a="|".join(re.escape(name) for name in config["images"]),
    image_b="|".join(re.escape(name) for name in config["images"]),
    model="|".join(re.escape(name) for name in config["models"]),
    tp=r"\d+",
    ep=r"\d+",
    arm="|".join(ARMS),


CELL_DIR = "results/{image}/{model}/tp{tp}-ep{ep}"
LOG_DIR = "results/logs/{image}/{model}/tp{tp}-ep{ep}"
BENCH_DIR = "results/benchmarks/{image}/{model}/tp{tp}-ep{ep}"
COMPARE_ID = "{image_a}-vs-{image_b}/{model}/tp{tp}-ep{ep}"


def all_targets():
    """What `all` builds: every cell's outputs, the report and one archive per label (and the
    image comparisons, with serve.compare_images)."""
    return (
        ["results/report/report.md"]
        + [f"results/archive/{label}/MANIFEST.json" for label in archive_labels()]
        + compare_targets()
    )


def compare_targets():
    """The comparisons' bench.json files; none unless serve.compare_images is set."""
    return [c.target() for c in COMPARISONS]


def archive_labels():
    return sorted({cbconfig.archive_label(config, c.image) for c in CELLS})


def cells_with_label(label):
    return [c for c in CELLS if cbconfig.archive_label(config, c.image) == label]


def cell_outputs(cells):
    return [path for c in cells for path in c.targets()]


def model_entry(wildcards):
    return config["models"][wildcards.model]


def local_model_dir(model):
    return f"results/assets/models/{model}"


def model_inputs(wildcards):
    """Files a stage needs for the cell's model: the locally built model, if any."""
    if model_entry(wildcards).get("build"):
        return {"model": local_model_dir(wildcards.model)}
    return {}


def model_source(wildcards):
    """What the server and the tuner are given: a local folder or a Hugging Face id."""
    entry = model_entry(wildcards)
    if entry.get("build"):
        return local_model_dir(wildcards.model)
    return entry["hf_id"]


def gpus_for(wildcards):
    """GPUs a cell's job holds: its TP size in containers, none for host processes."""
    return int(wildcards.tp) if RUNTIME == "docker" else 0


def in_cell_python(wildcards):
    """The interpreter that runs in-cell code: the image's, or this environment's."""
    if RUNTIME == "docker":
        return config["images"][wildcards.image].get("python", "python3")
    return PYTHON_HOST


def step_args(wildcards, *, env=()):
    """Arguments of `python -m cellbench.steps`: where and with which GPUs a step runs."""
    args = ["--runtime", RUNTIME]
    if RUNTIME == "docker":
        args += [
            "--image-ref",
            PINS.ref(wildcards.image),
            "--gpu-vendor",
            config["gpu_vendor"],
            "--gpus",
            str(gpus_for(wildcards)),
            "--total-gpus",
            str(config["gpus"]),
            "--lease-dir",
            "results/.leases",
            "--mount",
            f"{Path(config['hf_cache']).expanduser()}:/root/.cache/huggingface:rw",
            "--pass-env",
            "HF_TOKEN",
            "--label",
            f"cellbench.cell={wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
        ]
    for item in env:
        args += ["--env", item]
    return shlex.join(args)


def tune_args(wildcards):
    """The tuner's command line for a cell; everything that changes the result is in here."""
    model = model_entry(wildcards)
    tune = config["tune"]
    model_config = model.get("model_config") or model_source(wildcards)
    args = ["--model-config", model_config, "--tp", wildcards.tp]
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


def serve_inputs(wildcards, arms):
    inputs = model_inputs(wildcards)
    if "tuned" in arms:
        inputs["tuned"] = os.path.join(CELL_DIR.format(**wildcards), "tune", "configs")
    if config["gsm8k"]["local_questions"]:
        inputs["gsm8k"] = "results/assets/gsm8k"
    return inputs


def load_args(wildcards):
    """serve_stage's flags that every serve job shares: the model, its layout, the load grid."""
    model = model_entry(wildcards)
    serve = config["serve"]
    return [
        "--model",
        model_source(wildcards),
        "--served-model-name",
        wildcards.model,
        "--tp",
        wildcards.tp,
        "--ep",
        wildcards.ep,
        "--serve-args-json",
        json.dumps(model["serve_args"]),
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
        "--ready-timeout",
        str(serve["ready_timeout_s"]),
        "--max-failed-share",
        str(serve["max_failed_share"]),
    ]


def docker_server_args(wildcards):
    """serve_stage's flags for containerised servers: vendor, GPUs per server, HF cache."""
    return [
        "--gpu-vendor",
        config["gpu_vendor"],
        "--gpus",  # per server
        wildcards.tp,
        "--total-gpus",
        str(config["gpus"]),
        "--hf-cache",
        str(Path(config["hf_cache"]).expanduser()),
    ]


def serve_args(wildcards, input, arm):
    """serve_stage's command line for one arm, or for both (arm="pair")."""
    gsm8k = config["gsm8k"]
    # Flag order is part of the job's params: keep it stable, or finished cells rerun.
    args = [
        "--runtime",
        RUNTIME,
        "--cell-id",
        f"{wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
        "--arm",
        arm,
        *load_args(wildcards),
        "--gsm8k-fewshot",
        str(gsm8k["num_fewshot"]),
        "--lease-dir",
        "results/.leases",
    ]
    if gsm8k["limit"]:
        args += ["--gsm8k-limit", str(gsm8k["limit"])]
    if "gsm8k" in input.keys():
        args += ["--gsm8k-task-dir", input.gsm8k]
    if "tuned" in input.keys():
        args += ["--tuned-config-dir", input.tuned]
    if RUNTIME == "docker":
        args += ["--image-ref", PINS.ref(wildcards.image)]
    args += ["--image-digest", PINS.digest(wildcards.image)]
    if RUNTIME == "docker":
        args += docker_server_args(wildcards)
    return shlex.join(args)


def compare_cell_dir(wildcards, image):
    return CELL_DIR.format(
        image=image, model=wildcards.model, tp=wildcards.tp, ep=wildcards.ep
    )


def compare_inputs(wildcards):
    """A comparison reads the model and both cells' tuned configs (it serves the tuned arm)."""
    inputs = model_inputs(wildcards)
    inputs["tuned_a"] = os.path.join(
        compare_cell_dir(wildcards, wildcards.image_a), "tune", "configs"
    )
    inputs["tuned_b"] = os.path.join(
        compare_cell_dir(wildcards, wildcards.image_b), "tune", "configs"
    )
    return inputs


def compare_args(wildcards, input):
    """serve_stage's command line for a comparison: two images' tuned arms (--arm images)."""
    sides = []
    for image, tuned in (
        (wildcards.image_a, input.tuned_a),
        (wildcards.image_b, input.tuned_b),
    ):
        sides.append(
            {
                "name": image,
                "cell": f"{image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
                "image_ref": PINS.ref(image) if RUNTIME == "docker" else None,
                "image_digest": PINS.digest(image),
                "tuned_config_dir": tuned,
            }
        )
    args = [
        "--runtime",
        RUNTIME,
        "--cell-id",
        COMPARE_ID.format(**wildcards),
        "--arm",
        "images",
        *load_args(wildcards),
        "--lease-dir",
        "results/.leases",
        "--no-gsm8k",
        "--images-json",
        json.dumps(sides),
    ]
    if RUNTIME == "docker":
        args += docker_server_args(wildcards)
    return shlex.join(args)
