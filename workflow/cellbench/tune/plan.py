"""The tuner's job read and checked into a `Plan`, before any GPU work.

In-container module: stdlib + torch (+ vllm probed for --backend vllm).

Two ways in, one job: the workflow's ``--job JSON`` (``cellbench.config.jobargs.tune_job``)
and, by hand, one flag per field (`job_from_argv`, whose own limits stand in for the config's
in one place, `_check_flags`); both become a ``TuneJob``. `make_plan` then checks what only
the tuner's process can (output folder, model config, GPU, installed vLLM). Every refusal is a
`UsageError` (exit status 2). The batch-size tiers live here, so the config loader can read
them without the run loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellbench.tune.job import BACKENDS, KEEP_CHOICES, MODES, JobError, TuneJob
from cellbench.tune.shapes import ShapeError, add_shape_arguments, check_tp_ep

__all__ = [
    "Plan",
    "parse_batch_sizes",
    "BATCH_SIZE_TIERS",
    "KEEP_CHOICES",
    "UsageError",
    "job_from_argv",
    "make_plan",
]

_FLOAT_DTYPES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
}

VLLM_DEFAULT = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
AITER16 = [1 << i for i in range(16)]  # 1 .. 32768
BATCH_SIZE_TIERS = {"vllm_default": VLLM_DEFAULT, "aiter16": AITER16}


class UsageError(ValueError):
    """Bad command-line input (exit status 2)."""


def parse_batch_sizes(text: str) -> list[int]:
    """'vllm_default', 'aiter16' or a comma list of positive integers -> sorted unique list."""
    t = text.strip()
    if t in BATCH_SIZE_TIERS:
        return list(BATCH_SIZE_TIERS[t])
    parts = [p.strip() for p in t.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"--batch-sizes={text!r} is empty (e.g. 1,16,64, vllm_default, aiter16)")
    out = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise UsageError(
                f"--batch-sizes: {p!r} is not an integer (or use vllm_default / aiter16)"
            ) from None
        if v <= 0:
            raise UsageError(f"--batch-sizes: {v} must be a positive batch size")
        out.append(v)
    return sorted(set(out))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cellbench tune",
        description="Tune vLLM's fused-MoE Triton configs for one model shape.",
        epilog="The workflow passes the job whole (--job JSON, a TuneJob's fields, as "
        "cellbench.config.jobargs.tune_job builds it); each flag sets one field of it.",
        argument_default=argparse.SUPPRESS,  # only what is given joins the job
    )
    p.add_argument("--job", help="the job: a JSON object of TuneJob fields")
    add_shape_arguments(
        p,
        dtype_help="fp8_w8a8; none, bf16, fp16 or fp32 for unquantised; auto (from config)",
        defaults=False,
    )
    p.add_argument("--batch-sizes", help="1,16,64 | vllm_default (default) | aiter16")
    p.add_argument("--mode", choices=MODES, help="default (default)")
    p.add_argument("--backend", choices=BACKENDS, help="builtin (default)")
    p.add_argument(
        "--vllm-source",
        help="--backend vllm without a usable vLLM install: a folder of vLLM's Python sources "
        "(workflow/scripts/vllm-kernel-src.sh) whose Triton kernel is timed "
        "(default: $CELLBENCH_VLLM_SOURCE)",
    )
    p.add_argument("--max-configs", type=int, help="cap on configs considered per batch size")
    p.add_argument("--seed", type=int, help="default 0")
    p.add_argument(
        "--act-dtype",
        choices=("bf16", "fp16", "fp32"),
        help="activation/compute dtype (default bf16 on GPU, fp32 under the CPU interpreter)",
    )
    p.add_argument("--compile-workers", type=int, help="GPU only: compile processes per GPU")
    p.add_argument(
        "--compile-budget",
        help="default mode: FIRST,LATER new kernels per batch size (FIRST: the first batch "
        "size of each specialisation and one more than a doubling above the size before it; "
        "LATER: the others); 'none' for no limit (default 32,12 on GPU, 8,4 on CPU)",
    )
    p.add_argument(
        "--seed-configs",
        help="a vLLM config JSON (e.g. the one vLLM ships for this shape) whose nearest entry "
        "joins each batch size's candidates in default mode",
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        help="benchmarks only: stop after this many seconds; later batch sizes are left out "
        "and summary.json says complete=false",
    )
    p.add_argument(
        "--keep",
        choices=KEEP_CHOICES,
        help="beats-baseline (default): at a batch size where the side-by-side timing found the "
        "pick no faster than vLLM's own config, the tuned file holds vLLM's config instead "
        "(the entry says kept: baseline); all: every pick as tuned",
    )
    p.add_argument("--out", required=True, help="output folder")
    return p


def _check_flags(flags: dict[str, Any], tp: int) -> None:
    """The hand command line's own limits: those that the config schema and loader check for
    a job the workflow writes (tp, ep, max_configs; batch sizes as they are read)."""
    if ("tp" in flags or flags.get("ep")) and isinstance(tp, int):  # else: TuneJob's type error
        try:
            check_tp_ep(tp, bool(flags.get("ep")))
        except ShapeError as e:
            raise UsageError(str(e)) from None
    if "max_configs" in flags and flags["max_configs"] < 1:
        raise UsageError(f"--max-configs={flags['max_configs']} must be >= 1")


def _block_shape(text: str) -> Any:
    """--block-shape text as the job holds it: "auto", None or [n, k]."""
    t = text.strip().lower()
    if t in ("auto", "none"):
        return None if t == "none" else "auto"
    return _int_pair(t, f"--block-shape={text!r}: expected n,k (e.g. 128,128), none or auto")


def _batch_sizes(text: str) -> Any:
    t = text.strip()
    return t if t in BATCH_SIZE_TIERS else parse_batch_sizes(t)


def _compile_budget(text: str) -> Any:
    """'FIRST,LATER' -> [first, later]; 'none' -> 'none' (no limit); limits: TuneJob."""
    t = text.strip().lower()
    if t == "none":
        return "none"
    return _int_pair(
        t, f"--compile-budget={text!r}: expected FIRST,LATER (two integers, e.g. 32,12) or none"
    )


def _int_pair(text: str, error: str) -> list[int]:
    """'A,B' -> [a, b]; anything else is a UsageError with ``error``."""
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(error) from None
    return [a, b]


# Flags whose text becomes the job's value (after parsing, so a bad value's message is ours).
_CONVERT = {
    "block_shape": _block_shape,
    "batch_sizes": _batch_sizes,
    "compile_budget": _compile_budget,
}


def job_from_argv(argv: list[str]) -> tuple[TuneJob, str]:
    """The command line as one checked job and the output folder: ``--job`` merged with the
    flags given, each key once. SystemExit from argparse (--help, a bad choice)."""
    flags = vars(_parser().parse_args(argv))
    out = flags.pop("out")
    job: dict[str, Any] = {}
    if "job" in flags:
        try:
            job = json.loads(flags.pop("job"))
        except json.JSONDecodeError as e:
            raise UsageError(f"--job: not valid JSON ({e})") from None
        if not isinstance(job, dict):
            raise UsageError(f"--job must be a JSON object of TuneJob fields, got {job!r}")
    tp = flags.get("tp", job.get("tp", 1))
    _check_flags(flags, tp)
    for name, convert in _CONVERT.items():
        if name in flags:
            flags[name] = convert(flags[name])
    if "ep" in flags:  # --ep: expert parallel over the TP ranks
        flags["ep"] = tp if flags["ep"] else 1
    twice = sorted(set(job) & set(flags))
    if twice:
        raise UsageError(f"given twice (in --job and as a flag): {', '.join(twice)}")
    try:
        return TuneJob.from_job({**job, **flags}), out
    except JobError as e:
        raise UsageError(str(e)) from None


@dataclass
class Plan:
    """Everything validated, before any GPU work."""

    shape: Any
    batch_sizes: list[int]
    mode: str
    backend: str
    act_dtype: str
    on_gpu: bool
    platform: str
    device_name: str
    max_configs: int | None
    seed: int
    out: Path
    compile_workers: int
    argv: list[str]
    time_budget_s: float | None = None
    keep: str = "beats-baseline"
    compile_budget: tuple[int, int] | None | str = "auto"
    seed_table: dict[int, dict[str, int]] | None = None
    config_file: str = ""
    act_note: str = ""
    dtype_label: str = ""
    vllm_source: str | None = None
    seed_configs: str | None = None  # the seed table's file as given
    # The job it was made from: a setting that needs no checking here is read from it as it is.
    job: TuneJob | None = None


def _read_seed_table(path: str) -> dict[int, dict[str, int]]:
    """Entries of a vLLM config JSON as {M: config}; UsageError naming the bad part."""
    from cellbench.tune.artifacts import VLLM_KEYS

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--seed-configs {path}: cannot read a JSON file ({e})") from e
    if not isinstance(data, dict):
        raise UsageError(f"--seed-configs {path}: expected a JSON object of batch sizes")
    table = {}
    for k, v in data.items():
        if k == "triton_version":
            continue
        if not k.isdigit() or not isinstance(v, dict) or any(x not in v for x in VLLM_KEYS):
            raise UsageError(f"--seed-configs {path}: entry {k!r} is not a vLLM config entry")
        table[int(k)] = {x: int(y) for x, y in v.items()}
    if not table:
        raise UsageError(f"--seed-configs {path}: no batch-size entries")
    return table


def _check_out_folder(out: str) -> None:
    """--out must be a folder, or a path whose nearest existing parent is a writable folder:
    refused now, before any GPU work, rather than as a traceback when the first file is written."""
    if not out.strip():  # Path('') is the working folder: the tune would write into it
        raise UsageError(f"--out {out!r}: empty; expected a folder to write into")
    path = Path(out)
    probe = path
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():  # a dangling link: mkdir would fail on it
            raise UsageError(f"--out {out}: {probe} is a link to nothing")
        probe = probe.parent
    if not probe.is_dir():
        what = "--out itself" if probe == path else str(probe)
        raise UsageError(f"--out {out}: {what} is not a folder (expected a folder to write into)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: folder {probe} is not writable")


def _float_dtype(dtype: str) -> tuple[str | None, str | None]:
    """The job's dtype as the shape reads it, and the compute dtype a float dtype implies.
    A float dtype is also the compute dtype unless act_dtype says otherwise; vLLM names only
    fp32 in its file names."""
    d = dtype.lower()
    float_act = _FLOAT_DTYPES.get(d)
    if d == "none":
        return None, None
    if float_act is not None:
        return ("float32" if float_act == "fp32" else None), float_act
    return dtype, None


def resolve_batch_sizes(spec: Any) -> list[int]:
    """A job's batch sizes (a tier's name or a list) as a sorted list without repeats."""
    if isinstance(spec, str):
        if spec not in BATCH_SIZE_TIERS:
            raise UsageError(f"batch_sizes = {spec!r}: not a tier ({', '.join(BATCH_SIZE_TIERS)})")
        return list(BATCH_SIZE_TIERS[spec])
    return sorted(set(spec))


def _check_env(env: dict[str, str]) -> None:
    """The cell's variables are the step's to set (cellbench.runtime.steps --env); tuning
    without them would measure another configuration than the job names."""
    wrong = sorted(k for k, v in env.items() if os.environ.get(k) != v)
    if wrong:
        raise UsageError(
            f"the job's env {', '.join(f'{k}={env[k]!r}' for k in wrong)} is not this "
            "process's environment (the step sets a cell's variables: "
            "python -m cellbench.runtime.steps --env K=V)"
        )


def _kernel_shape(job: TuneJob, dtype: str | None) -> tuple[Any, Any]:
    """The shape as the model config names it (its vLLM file name) and as the kernels take
    it (fp32 an activation dtype, not a weight quantisation); UsageError where the tuner's
    kernels cannot run it."""
    from cellbench.tune.shapes import moe_shape, read_model_config

    try:
        cfg = read_model_config(job.model_config)
        named = moe_shape(
            cfg, job.tp, job.expert_parallel, dtype=dtype, block_shape=job.block_shape
        )
    except ShapeError as e:
        where = "" if job.model_config in str(e) else f"{job.model_config}: "
        raise UsageError(f"{where}{e}") from e
    shape = dataclasses.replace(named, dtype=None) if named.dtype == "float32" else named
    if shape.dtype not in (None, "fp8_w8a8"):
        raise UsageError(
            f"dtype={shape.dtype!r} with shape E={shape.num_experts},N={shape.intermediate_size}"
            f" is not supported by the tuner's kernels (supported: bf16/fp16, fp8_w8a8)"
        )
    if shape.block_shape is not None:
        bn, bk = shape.block_shape
        n, k = shape.intermediate_size, shape.hidden_size
        if (2 * n) % bn or k % bk or k % bn or n % bk:
            raise UsageError(
                f"--block-shape={bn},{bk} does not divide the weights (2N={2 * n}, K={k}, N={n})"
            )
    return named, shape


def _gpu_or_interpreter() -> bool:
    """Whether a GPU is here; without one, the Triton interpreter is switched on (refused
    where TRITON_INTERPRET says off)."""
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        ti = os.environ.get("TRITON_INTERPRET")
        if ti is not None and ti in ("", "0"):
            raise UsageError("no GPU and TRITON_INTERPRET=0: the CPU run needs the interpreter")
        os.environ["TRITON_INTERPRET"] = "1"
    return on_gpu


def _vllm_source(job: TuneJob) -> str | None:
    """For --backend vllm: the folder of vLLM's sources to run from (None: the installed
    vLLM), refused where neither can serve. Probed after the interpreter is chosen:
    importing vLLM imports Triton, which must already know whether kernels it decorates are
    to be interpreted."""
    if job.backend != "vllm":
        return None
    import importlib.util

    from cellbench.tune.vllm_source import source_from_env

    vllm_source = job.vllm_source or source_from_env()
    if importlib.util.find_spec("vllm") is None and vllm_source is None:
        raise UsageError(
            "--backend vllm needs vLLM installed where the tuner runs (no module 'vllm'), "
            "or --vllm-source / CELLBENCH_VLLM_SOURCE naming a folder of vLLM's Python "
            "sources (workflow/scripts/vllm-kernel-src.sh); or use --backend builtin"
        )
    from cellbench.tune.backends import vllm_refusal_or_source

    # e.g. vLLM without Triton and no source folder: refused before anything is timed
    why = vllm_refusal_or_source(vllm_source)
    if why is not None:
        raise UsageError(why)
    if vllm_source is not None:  # compile workers build their backend from the same folder
        from cellbench.tune.vllm_source import SOURCE_ENV

        os.environ[SOURCE_ENV] = vllm_source
    return vllm_source


def _compute_dtype(job: TuneJob, float_act: str | None, on_gpu: bool) -> tuple[str, str]:
    """The activation dtype the kernels compute in, and a note where it differs from the
    model's (the interpreter's bf16 dot is unusable: it computes in fp32 and says so)."""
    act = job.act_dtype or float_act or ("bf16" if on_gpu else "fp32")
    if not on_gpu and act == "bf16":
        if job.act_dtype == "bf16":
            raise UsageError("--act-dtype bf16 does not run under the CPU interpreter (fp16/fp32)")
        return "fp32", "bf16 model: the CPU interpreter computes in fp32"
    return act, ""


def _compile_workers(job: TuneJob, on_gpu: bool) -> int:
    """The job's compile workers; by default, on a GPU with the builtin kernel, this GPU's
    share of the cores less one (none on CPU)."""
    workers = job.compile_workers
    if workers is None:
        workers = 0
        if on_gpu and job.backend == "builtin":
            import torch

            ngpu = max(torch.cuda.device_count(), 1)
            workers = max((os.cpu_count() or 2) // ngpu - 1, 0)
    return workers if on_gpu else 0


def make_plan(job: TuneJob, out: str, argv: list[str]) -> Plan:
    """What only this process can check (the output folder, the model config, the GPU, the
    installed packages), and the plan the run follows; UsageError."""
    _check_out_folder(out)
    _check_env(job.env)
    batch_sizes = resolve_batch_sizes(job.batch_sizes)
    cb = job.compile_budget  # "auto" | "none" (no limit) | [first, later]
    compile_budget = tuple(cb) if isinstance(cb, list) else (None if cb == "none" else cb)
    dtype, float_act = _float_dtype(job.dtype)
    named, shape = _kernel_shape(job, dtype)
    on_gpu = _gpu_or_interpreter()
    vllm_source = _vllm_source(job)
    import torch

    plat = "cpu" if not on_gpu else ("rocm" if getattr(torch.version, "hip", None) else "cuda")
    act, act_note = _compute_dtype(job, float_act, on_gpu)
    if job.device_name:
        dev_name = job.device_name
    else:
        from cellbench.tune.shapes import device_name

        dev_name = device_name()
    seed_table = None
    if job.seed_configs:
        seed_table = _read_seed_table(job.seed_configs)
    return Plan(
        shape=shape,
        batch_sizes=batch_sizes,
        mode=job.mode,
        backend=job.backend,
        act_dtype=act,
        on_gpu=on_gpu,
        platform=plat,
        device_name=dev_name,
        max_configs=job.max_configs or None,
        seed=job.seed,
        out=Path(out),
        compile_workers=_compile_workers(job, on_gpu),
        argv=argv,
        time_budget_s=job.time_budget_s,
        keep=job.keep,
        compile_budget=compile_budget,
        seed_table=seed_table,
        config_file=named.config_file_name(dev_name),
        act_note=act_note,
        dtype_label=shape.dtype or float_act or act,
        vllm_source=vllm_source,
        seed_configs=job.seed_configs,
        job=job,
    )
