# Config validation, the cell model and input functions shared by every stage.
import json
import mimetypes
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
from cellbench.config import loader as cbconfig  # noqa: E402
from cellbench.config import jobargs  # noqa: E402
from cellbench.config import strict_yaml  # noqa: E402
from cellbench.config import ceiling  # noqa: E402
from cellbench.contracts import gsm8k_dataset  # noqa: E402
from cellbench.runtime import pins  # noqa: E402

try:
    # Snakemake merged the config files with a reader that keeps the last of two equal keys;
    # re-read them strictly so a duplicate key is refused, naming the file and both lines.
    strict_yaml.check_files(workflow.configfiles)
    cbconfig.validate(config)
    # The plan's price against its ceiling (above the loader: the estimate imports it).
    ceiling.check_config(config)
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


def _config_file_hint():
    """The config file this run was given (the last --configfile), for the lock command."""
    files = [str(f) for f in workflow.configfiles]
    return shlex.quote(os.path.relpath(files[-1])) if files else "config/config.yaml"


PINS = pins.Pins.for_config(config)
if PINS.unpinned():
    # The plan is still shown (and `-n` stays useful); the jobs themselves refuse to run a tag.
    logger.warning(
        f"images not pinned in {config['image_lock']}: {', '.join(PINS.unpinned())}; "
        "their jobs will refuse to start until "
        f"`cellbench images lock --configfile {_config_file_hint()}` pins them"
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


# Results that are not a cell's (report, plan, the generated question set) lie in folders of
# their own per config, so that running one config never plans another's jobs again: the
# report and the plan under the config's run_label, the question set under its count.
RUN_LABEL = config["run_label"]
REPORT_DIR = f"results/report/{RUN_LABEL}"
GSM8K_SET = gsm8k_dataset.GENERATED_DIR.format(n=config["gsm8k"]["local_questions"])
CELL_DIR = "results/{image}/{model}/tp{tp}-ep{ep}"
LOG_DIR = "results/logs/{image}/{model}/tp{tp}-ep{ep}"
BENCH_DIR = "results/benchmarks/{image}/{model}/tp{tp}-ep{ep}"
COMPARE_ID = "{image_a}-vs-{image_b}/{model}/tp{tp}-ep{ep}"


def all_targets():
    """What `all` builds: every cell's outputs, the report and one archive per label (and the
    image comparisons, with serve.compare_images). The report's INDEX.json and each archive's
    receipt ARCHIVED.json are written last, so a failure leaves the report.md and the archived
    run folders users read in place.
    Every stage result the plan needs is asked for by name, not only the aggregates: Snakemake
    does not rebuild a missing file whose readers' outputs are present, so a deleted result
    would otherwise stay missing behind a "Nothing to be done".
    """
    return (
        every_stage_result()
        + [f"{REPORT_DIR}/INDEX.json"]
        + [f"results/archive/{label}/ARCHIVED.json" for label in archive_labels()]
        + [f"results/configs/{label}/INDEX.json" for label in archive_labels()]
        + compare_targets()
        # Last: fails the run on a failed GSM8K gate, after the report and archives exist.
        + [GATES_SUMMARY]
    )


def every_stage_result():
    """Each job's declared outputs below the aggregates: the built models and question set,
    per cell its tuned configs, both arms' lm-eval folders and results, its gate verdict and
    figures, and the report's files."""
    out = []
    for model in sorted({c.model for c in CELLS}):
        if config["models"][model].get("build"):
            out.append(local_model_dir(model))
    if config["gsm8k"]["local_questions"]:
        out.append(GSM8K_SET)
    for c in CELLS:
        out += c.targets() + [f"{c.path}/tune/configs", f"{c.path}/gate.json"]
        out += [f"{c.path}/serve/{arm}/lm_eval" for arm in ARMS]
    out += cell_plot_files(CELLS)
    out += [os.path.join(PLOT_DIR.format(**c.__dict__), "bump") for c in CELLS]
    out += [f"{REPORT_DIR}/{name}" for name in REPORT_FILES]
    out += [f"{REPORT_DIR}/pr/{model}.md" for model in sorted({c.model for c in CELLS})]
    if compare_targets():
        out.append(f"{REPORT_DIR}/compare.csv")
    return out


REPORT_FILES = (
    "report.md",
    "serve.csv",
    "gsm8k.csv",
    "tune.csv",
    "tidy.csv",
    "tidy.parquet",
)


def stage_result_paths():
    """Every stage result of the config's cells a reader checks, and the lm-eval folders the
    GSM8K results come from: what the refused-result check below looks at."""
    out = []
    for c in CELLS:
        out.append(f"{c.path}/tune/summary.json")
        for arm in ARMS:
            out.append(f"{c.path}/serve/{arm}/bench.json")
            out.append(f"{c.path}/serve/{arm}/lm_eval")
            out.append(f"{c.path}/gsm8k/{arm}.json")
        out.append(f"{c.path}/gate.json")
    return out + compare_targets()


_REFUSED = []  # filled once per plan by refused_results()


def refused_results(wildcards):
    """An input function of every job that writes a stage result; it adds no input. The first
    call of a plan finds each result that is present but refused (unreadable, truncated, edited,
    its checksum gone), says so, and forces its job as `--forcerun PATH` would; its readers
    follow through their newer input. A force leaves no trace in Snakemake's records, so once
    the rebuilt result is whole the next plan is empty (a refusal carried as a params value is
    recorded by the job that repairs it and plans that job a second time). It runs while the
    DAG is built, before Snakemake decides which jobs need to run (`dag.forcefiles`, read
    there; Snakemake is pinned). Only the main process looks: a cluster job's own Snakemake
    runs that job alone."""
    if not workflow.is_main_process or workflow.dag is None:
        return []
    if not _REFUSED:
        from cellbench.results import refused

        _REFUSED.append(refused.refused(stage_result_paths(), "results"))
        for path, why in _REFUSED[0]:
            logger.warning(f"result refused, its job is planned again: {why}")
    # (every DAG this process builds, each once: the set ignores a path added again)
    workflow.dag.forcefiles.update(path for path, _ in _REFUSED[0])
    return []


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
    return jobargs.local_model_dir(model)


def model_inputs(wildcards):
    """Files a stage needs for the cell's model: the locally built model, if any."""
    if model_entry(wildcards).get("build"):
        return {"model": local_model_dir(wildcards.model)}
    return {}


def model_source(wildcards):
    """What the server and the tuner are given: a local folder or a Hugging Face id."""
    return jobargs.model_source(config, wildcards.model)


def gpus_for(wildcards):
    """GPUs a cell's job holds: its TP size in containers, none for host processes."""
    return jobargs.gpus_per_server(config, wildcards)


def in_cell_python(wildcards):
    """The interpreter that runs in-cell code: the image's, or this environment's."""
    if RUNTIME == "docker":
        return config["images"][wildcards.image].get("python", "python3")
    return PYTHON_HOST


# Rerun triggers (cellbench/config/jobargs.py, docs/rerun-triggers.md): a params function of
# wildcards alone is compared with the last run's value, so `*_settings` carry every value
# that shapes a result. Host details go through functions that also take `input`, which
# Snakemake leaves out of that comparison on purpose: changing them reruns nothing.


def tune_settings(wildcards):
    return jobargs.tune_settings(config, PINS, wildcards)


def step_host_args(wildcards, input):
    return jobargs.step_flags(config, PINS, wildcards)


def serve_inputs(wildcards, arms):
    inputs = model_inputs(wildcards)
    if "tuned" in arms:
        inputs["tuned"] = os.path.join(CELL_DIR.format(**wildcards), "tune", "configs")
    if config["gsm8k"]["local_questions"]:
        # gsm8k.dataset is a file inside this folder (the config check makes sure).
        inputs["gsm8k"] = GSM8K_SET
    elif config["gsm8k"]["dataset"].endswith(".jsonl"):
        # A local question file: editing it reruns GSM8K like any other input.
        inputs["gsm8k"] = config["gsm8k"]["dataset"]
    return inputs


def serve_settings(wildcards, arm):
    return jobargs.serve_settings(config, PINS, wildcards, arm)


def serve_host_args(wildcards, input):
    return jobargs.serve_host(config, input)


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


def compare_settings(wildcards):
    return jobargs.compare_settings(config, PINS, wildcards)


def compare_args(wildcards, input):
    return jobargs.compare_args(config, PINS, wildcards, input)


def configs_settings(label):
    """The configs job's tracked values (tune.keep, tune.min_improvement_pct, its cells)."""
    return jobargs.configs_settings(config, PINS, cells_with_label(label))


def configs_images(label):
    """Per image of the label's cells: digest and ROCm version (and where it was read)."""
    return json.dumps(json.loads(configs_settings(label))["images"], sort_keys=True)


def archive_settings_hash(wildcards):
    """What the archive records as its configuration: the tracked settings of its cells."""
    return jobargs.results_hash(config, PINS, cells_with_label(wildcards.label))


def logged(command):
    """A rule's shell: the command's output goes to the job's log; if it fails, the log's last
    meaningful lines are printed on the terminal too (not only "check log file(s)")."""
    return (
        f"({command}) > {{log}} 2>&1 || "
        "{{ rc=$?; python -m cellbench.joblog {log:q} >&2; exit $rc; }}"
    )


# --- figures and report files (workflow/rules/report.smk) ---

# `snakemake --report` embeds each file with the MIME type Python guesses; Parquet is not known
# to it and would be labelled text.
mimetypes.add_type("application/vnd.apache.parquet", ".parquet")

PLOT_DIR = f"{REPORT_DIR}/plots/{{image}}/{{model}}/tp{{tp}}-ep{{ep}}"
CELL_CATEGORY = "{image}/{model}/tp{tp}-ep{ep}"
# Figure -> the stage whose results it shows (the subcategory in Snakemake's report).
PLOT_STAGES = {
    "latency": "serve",
    "arm_change": "serve",
    "tuner_speedup": "tune",
    "gsm8k": "gsm8k",
}
ALL_CELLS = "All cells"


def plot_outputs():
    """The plots rule's outputs by name (latency_png, ...), each marked for the report.
    update(): Snakemake keeps them while the job runs and puts them back if it fails (a
    refused input), so the report never links figures a failed job removed."""
    out = {}
    for name, stage in PLOT_STAGES.items():
        for fmt in ("png", "svg"):
            out[f"{name}_{fmt}"] = report(
                update(f"{PLOT_DIR}/{name}.{fmt}"),
                caption=f"../report/{name}.rst",
                category=CELL_CATEGORY,
                subcategory=stage,
            )
    # Drawn only when the cell has a previous archived run with other results.
    out["bump"] = report(
        update(directory(f"{PLOT_DIR}/bump")),
        patterns=["{plot}.png", "{plot}.svg"],
        caption="../report/bump.rst",
        category=CELL_CATEGORY,
        subcategory="archive",
    )
    return out


def cell_plot_files(cells):
    """The declared figure files of ``cells`` (the report's inputs)."""
    return [
        "/".join(
            (PLOT_DIR.format(image=c.image, model=c.model, tp=c.tp, ep=c.ep), name)
        )
        + f".{fmt}"
        for c in cells
        for name in PLOT_STAGES
        for fmt in ("png", "svg")
    ]


def report_table(path, caption):
    """A report file marked for `snakemake --report` and kept by Snakemake on failure."""
    return report(
        update(path),
        caption=f"../report/{caption}.rst",
        category=ALL_CELLS,
        subcategory="report",
    )
