"""`python -m cellbench.tune` / `cellbench tune`: tune the fused-MoE kernel for one shape.

In-container module: stdlib + torch + triton (+ vllm for --backend vllm).

Outputs in --out DIR: configs/<vLLM file name>.json, tuned_fmoe.csv, tuning_log.jsonl and, last
(it marks the step complete), summary.json. Bad input exits 2 before any GPU work.

Each summary entry also records its baseline, the config vLLM would use at that batch size
without the tuned file, timed side by side with the pick, and the pick's improvement_pct over
it (see baseline.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellbench.tune.shapes import add_shape_arguments

__all__ = ["main", "parse_batch_sizes", "BATCH_SIZE_TIERS", "UsageError"]

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

LOG_NAME = "tuning_log.jsonl"
SUMMARY_NAME = "summary.json"
CSV_NAME = "tuned_fmoe.csv"


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
    )
    add_shape_arguments(
        p, dtype_help="fp8_w8a8; none, bf16, fp16 or fp32 for unquantised; auto (from config)"
    )
    p.add_argument("--batch-sizes", default="vllm_default", help="1,16,64 | vllm_default | aiter16")
    p.add_argument("--mode", choices=("default", "exhaustive"), default="default")
    p.add_argument("--backend", choices=("builtin", "vllm"), default="builtin")
    p.add_argument(
        "--vllm-source",
        help="--backend vllm without a usable vLLM install: a folder of vLLM's Python sources "
        "(workflow/scripts/vllm-kernel-src.sh) whose Triton kernel is timed "
        "(default: $CELLBENCH_VLLM_SOURCE)",
    )
    p.add_argument("--max-configs", type=int, help="cap on configs considered per batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--act-dtype",
        choices=("bf16", "fp16", "fp32"),
        help="activation/compute dtype (default bf16 on GPU, fp32 under the CPU interpreter)",
    )
    p.add_argument("--compile-workers", type=int, help="GPU only: compile processes per GPU")
    p.add_argument(
        "--compile-budget",
        help="default mode: FIRST,LATER new kernels per batch size (first batch size of each "
        "specialisation, the others); 'none' for no limit (default 32,12 on GPU, 8,4 on CPU)",
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
        default="beats-baseline",
        help="beats-baseline (default): at a batch size where the side-by-side timing found the "
        "pick no faster than vLLM's own config, the tuned file holds vLLM's config instead "
        "(the entry says kept: baseline); all: every pick as tuned",
    )
    p.add_argument("--out", required=True, help="output folder")
    return p


KEEP_CHOICES = ("beats-baseline", "all")
# An entry's measurements of its pick's own kernel (timing kept in time_us as the baseline's).
_PICK_FIELDS = ("time_us", "spread", "samples_us", "error_vs_reference", "gemm1_us", "gemm2_us",
                "gemms_us", "kernel_path", "roofline", "config_name")  # fmt: skip
_VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
              "num_stages")  # fmt: skip
_ROCM_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def apply_keep(entries: dict[str, dict[str, Any]], keep: str) -> list[int]:
    """Under ``beats-baseline``, replace each pick that its side-by-side timing found no faster
    than the baseline (improvement_pct <= 0) with the baseline's config, keeping the pick under
    ``tuned_pick``; mark every entry ``kept``: pick or baseline (and why a slower pick stayed).
    Returns the batch sizes that now hold the baseline's config. Changes ``entries`` in place."""
    swapped = []
    for m, entry in entries.items():
        base = entry.get("baseline") or {}
        gain = entry.get("improvement_pct")
        entry["kept"] = "pick"
        if gain is None or gain > 0:
            continue
        config = {k: v for k, v in (base.get("config") or {}).items()
                  if k in _VLLM_KEYS + _ROCM_KEYS}  # fmt: skip
        if keep == "all":
            entry["kept"] = "pick (not faster than the baseline; --keep all)"
        elif any(not isinstance(config.get(k), int) or config[k] < 1 for k in _VLLM_KEYS):
            entry["kept"] = "pick (not faster, but the baseline's config is not a whole one)"
        else:
            # What was measured of the pick moves with it: none of it describes the baseline.
            moved = [k for k in _PICK_FIELDS if k in entry]
            entry["tuned_pick"] = {"config": entry["config"], **{k: entry.pop(k) for k in moved}}
            entry["config"] = config
            entry["config_name"] = f"vllm_{base.get('source', 'baseline')}_config"
            entry["roofline"] = {"fused": dict.fromkeys(
                ("roofline_fraction", "achieved_flops_per_s", "achieved_bytes_per_s"))}  # fmt: skip
            entry["time_us"] = base.get("time_us") or entry["tuned_pick"].get("time_us")
            entry["kept"] = "baseline"
            # measured for the pick's kernel: not a choice for the baseline's config
            entry.pop("path_choice", None)
            swapped.append(int(m))
    return sorted(swapped)


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


def _parse_compile_budget(text: str | None) -> tuple[int, int] | None | str:
    """'FIRST,LATER' -> (first, later); 'none' -> None; absent -> 'auto'."""
    if text is None:
        return "auto"
    t = text.strip().lower()
    if t == "none":
        return None
    parts = t.split(",")
    try:
        first, later = (int(x) for x in parts)
    except ValueError:
        raise UsageError(
            f"--compile-budget={text!r}: expected FIRST,LATER (two integers, e.g. 32,12) or none"
        ) from None
    if first < 1 or later < 1:
        raise UsageError(f"--compile-budget={text!r}: both numbers must be >= 1")
    return first, later


def _check_out_folder(out: str) -> None:
    """--out must be a folder, or a path whose nearest existing parent is a writable folder:
    refused now, before any GPU work, rather than as a traceback when the first file is written."""
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


class OutputError(OSError):
    """The output folder could not be written (exit status 2, one line)."""


def _validate(args: argparse.Namespace, argv: list[str]) -> Plan:
    from cellbench.tune.shapes import (
        ShapeError,
        check_shape_arguments,
        moe_shape,
        read_model_config,
    )

    try:
        check_shape_arguments(args)  # the same refusals as `cellbench shapes`
    except ShapeError as e:
        raise UsageError(str(e)) from None
    if args.max_configs is not None and args.max_configs < 1:
        raise UsageError(f"--max-configs={args.max_configs} must be >= 1")
    budget = args.time_budget_s
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UsageError(
            f"--time-budget-s={budget:g} must be a number of seconds > 0 (leave it out for no "
            "budget); a run with none left would tune nothing"
        )
    if args.compile_workers is not None and args.compile_workers < 0:
        raise UsageError(f"--compile-workers={args.compile_workers} must be >= 0")
    _check_out_folder(args.out)
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    compile_budget = _parse_compile_budget(args.compile_budget)
    block = None if args.block_shape.lower() == "none" else args.block_shape
    # --dtype names the model's MoE dtype as the config does: a float dtype (also the compute
    # dtype unless --act-dtype says otherwise), fp8_w8a8, or auto (quantization_config).
    d = args.dtype.lower()
    float_act = _FLOAT_DTYPES.get(d)
    if d == "none":
        dtype: str | None = None
    elif float_act is not None:
        dtype = "float32" if float_act == "fp32" else None  # vLLM names only fp32 in files
    else:
        dtype = args.dtype
    try:
        cfg = read_model_config(args.model_config)
        named = moe_shape(cfg, args.tp, args.ep, dtype=dtype, block_shape=block)
    except ShapeError as e:
        where = "" if args.model_config in str(e) else f"{args.model_config}: "
        raise UsageError(f"{where}{e}") from e
    # the kernels take fp32 as an activation dtype, not as a weight quantisation
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

    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        ti = os.environ.get("TRITON_INTERPRET")
        if ti is not None and ti in ("", "0"):
            raise UsageError("no GPU and TRITON_INTERPRET=0: the CPU run needs the interpreter")
        os.environ["TRITON_INTERPRET"] = "1"
    # vLLM is probed after the interpreter is chosen: importing it imports Triton, which
    # must already know whether kernels it decorates are to be interpreted
    vllm_source = None
    if args.backend == "vllm":
        import importlib.util

        from cellbench.tune.vllm_source import source_from_env

        vllm_source = args.vllm_source or source_from_env()
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
    plat = "cpu" if not on_gpu else ("rocm" if getattr(torch.version, "hip", None) else "cuda")
    act_note = ""
    act = args.act_dtype or float_act or ("bf16" if on_gpu else "fp32")
    if not on_gpu and act == "bf16":
        if args.act_dtype == "bf16":
            raise UsageError("--act-dtype bf16 does not run under the CPU interpreter (fp16/fp32)")
        # the interpreter's bf16 dot is unusable: compute in fp32 and say so
        act, act_note = "fp32", "bf16 model: the CPU interpreter computes in fp32"
    if args.device_name:
        dev_name = args.device_name
    else:
        from cellbench.tune.shapes import device_name

        dev_name = device_name()
    seed_table = None
    if args.seed_configs:
        seed_table = _read_seed_table(args.seed_configs)
    workers = args.compile_workers
    if workers is None:
        workers = 0
        if on_gpu and args.backend == "builtin":
            ngpu = max(torch.cuda.device_count(), 1)
            workers = max((os.cpu_count() or 2) // ngpu - 1, 0)
    return Plan(
        shape=shape,
        batch_sizes=batch_sizes,
        mode=args.mode,
        backend=args.backend,
        act_dtype=act,
        on_gpu=on_gpu,
        platform=plat,
        device_name=dev_name,
        max_configs=args.max_configs,
        seed=args.seed,
        out=Path(args.out),
        compile_workers=workers if on_gpu else 0,
        argv=argv,
        time_budget_s=args.time_budget_s,
        keep=args.keep,
        compile_budget=compile_budget,
        seed_table=seed_table,
        config_file=named.config_file_name(dev_name),
        act_note=act_note,
        dtype_label=shape.dtype or float_act or act,
        vllm_source=vllm_source,
    )


def _options(plan: Plan):
    from cellbench.tune.search import TuneOptions

    if plan.on_gpu:
        opts = TuneOptions(
            mode=plan.mode,
            max_configs=plan.max_configs,
            seed=plan.seed,
            on_gpu=True,
            compile_workers=plan.compile_workers,
            time_budget_s=plan.time_budget_s,
            seed_table=plan.seed_table,
        )
        if plan.compile_budget != "auto":
            opts.compile_budget = plan.compile_budget  # type: ignore[assignment]
        return opts
    # interpreter: few repeats, two input sets, a small budget (the tiny space is 16 configs)
    return TuneOptions(
        mode=plan.mode,
        max_configs=plan.max_configs,
        seed=plan.seed,
        on_gpu=False,
        rotate=2,
        repeats=5,
        halving_repeats=(1, 3),
        finalists=3,
        warm_start=3,
        abandon_factor=3.0,
        time_budget_s=plan.time_budget_s,
        seed_table=plan.seed_table,
        compile_budget=(8, 4) if plan.compile_budget == "auto" else plan.compile_budget,  # type: ignore[arg-type]
        moves_per_round=4,
        local_rounds=2,
        round0_max=8,
    )


def _space(plan: Plan):
    from cellbench.tune import spaces

    if plan.platform == "cpu":
        return "tiny", spaces.tiny_space(plan.shape.block_shape)
    if plan.platform == "rocm":
        import torch

        arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
        fp16 = plan.shape.dtype is None and plan.act_dtype == "fp16"
        return "rocm", spaces.rocm_space(fp16, arch.startswith("gfx9"), plan.shape.block_shape)
    return "cuda", spaces.cuda_space(plan.shape.block_shape)


def _operand_bytes(plan: Plan) -> int:
    if plan.shape.dtype == "fp8_w8a8":
        return 1
    return 4 if plan.act_dtype == "fp32" else 2


def _measure_entry(backend: Any, plan: Plan, entry: Any, problems: list[Any], ceil: Any):
    """Per-GEMM and fused times of the chosen config, and its roofline fractions."""
    from cellbench.tune import roofline
    from cellbench.tune.timing import time_calls

    cfg = entry.config
    reps = 20 if plan.on_gpu else 3
    out: dict[str, Any] = {"kernel_path": backend.kernel_path(problems[0])}
    g = None
    try:
        g = [backend.gemm_calls(p, cfg) for p in problems]
    except Exception:  # noqa: BLE001
        g = None
    if g and all(x is not None for x in g):
        t1 = time_calls([x[0] for x in g], on_gpu=plan.on_gpu, repeats=reps)
        t2 = time_calls([x[1] for x in g], on_gpu=plan.on_gpu, repeats=reps)
        out["gemm1_us"], out["gemm2_us"] = t1.median_us, t2.median_us
    else:
        out["gemm1_us"] = out["gemm2_us"] = None
    tg = time_calls(
        [backend.gemms_call(p, cfg) for p in problems], on_gpu=plan.on_gpu, repeats=reps
    )
    out["gemms_us"] = tg.median_us
    s = plan.shape
    touched = max(backend.experts_touched(p) for p in problems)
    wb = 1 if s.dtype == "fp8_w8a8" else (4 if plan.act_dtype == "fp32" else 2)
    ob = 4 if plan.act_dtype == "fp32" else 2
    kw = dict(
        m=entry.m,
        n=s.intermediate_size,
        k=s.hidden_size,
        topk=s.topk,
        experts_touched=touched,
        weight_bytes=wb,
        act_bytes=wb,
        out_bytes=ob,
        block_shape=s.block_shape,
    )
    w1, w2 = roofline.gemm_works(**kw)
    wf = roofline.fused_work(**kw)
    out["experts_touched"] = touched
    out["roofline"] = {
        "fused": roofline.fractions(wf, entry.time_us, ceil),
        "gemm1": roofline.fractions(w1, out["gemm1_us"], ceil) if out["gemm1_us"] else None,
        "gemm2": roofline.fractions(w2, out["gemm2_us"], ceil) if out["gemm2_us"] else None,
    }
    return out


def _run_device(plan: Plan, batch_sizes: list[int], device_index: int) -> dict[str, Any]:
    """Tune `batch_sizes` on one device (GPU index or CPU); returns JSON-ready results."""
    import torch

    from cellbench.tune import roofline, spaces
    from cellbench.tune.artifacts import TuningLog
    from cellbench.tune.backends import make_backend
    from cellbench.tune.search import Tuner

    t_wall = time.perf_counter()
    c_self = time.process_time()
    opts = _options(plan)
    pool = None
    if plan.on_gpu and opts.compile_workers > 0:
        from cellbench.tune.compilepool import CompilePool

        # Started first: the workers import and initialise while this process builds weights.
        pool = CompilePool(
            opts.compile_workers, plan.backend, plan.shape.to_dict(), plan.act_dtype, device_index
        )
    try:
        if plan.on_gpu:
            torch.cuda.set_device(device_index)
            device = torch.device("cuda", device_index)
            if pool is not None and pool.compile_only:
                from cellbench.tune.kernels.launch_policy import device_facts

                pool.assume_device(*device_facts(device))
        else:
            device = torch.device("cpu")
            torch.set_num_threads(max(os.cpu_count() or 1, 1))
        backend = make_backend(
            plan.backend, plan.shape, plan.act_dtype, device, seed=plan.seed,
            vllm_source=plan.vllm_source,
        )  # fmt: skip
        space_name, space = _space(plan)
        limits = spaces.HardwareLimits.detect()
        log = TuningLog(plan.out / LOG_NAME)
        setup_s = time.perf_counter() - t_wall
        tuner = Tuner(
            backend,
            space,
            n=plan.shape.intermediate_size,
            k=plan.shape.hidden_size,
            operand_bytes=_operand_bytes(plan),
            limits=limits,
            options=opts,
            log=log,
            compile_pool=pool,
        )
        entries = tuner.tune(batch_sizes)
        if pool is not None:
            pool.close()  # no worker competes with the ceilings' and the entries' timings
        # Measured after tuning, not during setup, where the compile workers start up.
        ceil = roofline.measure_ceilings(device) if plan.on_gpu else roofline.Ceilings(None, None)
        if plan.on_gpu and plan.shape.dtype == "fp8_w8a8":
            fp8 = roofline.measure_ceilings(device, backend.base.w1.dtype)
            ceil = roofline.Ceilings(ceil.copy_bytes_per_s, fp8.matmul_flops_per_s,
                                     fp8.matmul_dtype, fp8.note)  # fmt: skip
        from cellbench.tune.baseline import baseline_source, measure, seed_path_from_argv

        src = baseline_source(plan.config_file, plan.seed_table, seed_path_from_argv(plan.argv))
        details = {}
        for m, e in entries.items():
            problems = [backend.make_problem(m, plan.seed * 1000 + i) for i in range(opts.rotate)]
            details[m] = {**e.to_dict(), **_measure_entry(backend, plan, e, problems, ceil)}
            # What the tuned file changes at m: vLLM's config without it, timed side by side
            # with the pick, as the final timed the finalists.
            base, gain = measure(
                backend, problems, e.config, src, m, plan.shape,
                rocm=plan.platform == "rocm", on_gpu=plan.on_gpu,
                graph_calls=opts.graph_calls, repeats=opts.repeats,
            )  # fmt: skip
            details[m]["baseline"] = base
            details[m]["improvement_pct"] = gain
            # The builtin kernel's few-token path is taken only where this measures it faster
            # with the kept config (written beside vLLM's JSON; see run()).
            if hasattr(backend, "measure_paths"):
                choice = backend.measure_paths(
                    m, e.config, plan.on_gpu, seed=plan.seed, repeats=20 if plan.on_gpu else 3
                )
                if choice is not None:
                    details[m]["path_choice"] = choice
            print(kept_line(m, e.timed, details[m]), file=sys.stderr, flush=True)
    finally:
        if pool is not None:
            pool.close()
    stats = tuner.stats
    if pool is not None:
        stats.compile_cpu_s = pool.cpu_s
    stats.cpu_s = time.process_time() - c_self + stats.compile_cpu_s
    stats.setup_s = setup_s
    if pool is not None:
        stats.compile_wait_s = pool.wait_s
    workers = None
    if pool is not None:  # start-up in seconds after the pool was created (see the pool)
        workers = {k: round(v, 3) for k, v in pool.startup().items()}
        workers["compile_only"] = pool.compile_only
    return {
        "entries": {str(m): d for m, d in details.items()},
        "compile_workers": workers,
        "stats": stats.to_dict(),
        "wall_s": time.perf_counter() - t_wall,
        "space": {"name": space_name, "size": len(space)},
        "limits": limits.__dict__,
        "ceilings": ceil.to_dict(),
        "timing": {
            "method": next(iter(entries.values())).method if entries else None,
            "graph_calls": opts.graph_calls if plan.on_gpu else 1,
            "repeats_final": opts.repeats,
            "input_sets_rotated": opts.rotate,
        },
        "resumed_log_records": log.resumed,
        "compile_budget": list(opts.compile_budget)
        if opts.mode == "default" and opts.compile_budget
        else None,
        "skipped_batch_sizes": tuner.skipped,
        "device_index": device_index,
        "vllm_kernel": backend.kernel_record() if hasattr(backend, "kernel_record") else None,
    }


def _device_worker(plan: Plan, ms: list[int], idx: int, result_path: str) -> None:
    from cellbench.tune.artifacts import atomic_write_json

    res = _run_device(plan, ms, idx)
    atomic_write_json(result_path, res)


def _split(ms: list[int], parts: int) -> list[list[int]]:
    """Contiguous chunks (warm starts stay within a chunk), balanced by count."""
    parts = max(1, min(parts, len(ms)))
    size = math.ceil(len(ms) / parts)
    return [ms[i : i + size] for i in range(0, len(ms), size)]


def _run_all(plan: Plan) -> dict[str, Any]:
    import torch

    ngpu = torch.cuda.device_count() if plan.on_gpu else 0
    if ngpu <= 1 or len(plan.batch_sizes) == 1:
        return _run_device(plan, plan.batch_sizes, 0)
    chunks = _split(plan.batch_sizes, ngpu)
    ctx = mp.get_context("spawn")
    procs = []
    for i, ms in enumerate(chunks):
        path = plan.out / f".device{i}.result.json"
        path.unlink(missing_ok=True)
        p = ctx.Process(target=_device_worker, args=(plan, ms, i, str(path)))
        p.start()
        procs.append((p, path))
    merged: dict[str, Any] = {"entries": {}, "stats": {}, "per_device": []}
    for p, path in procs:
        p.join()
        if p.exitcode != 0 or not path.exists():
            raise RuntimeError(f"tuning on GPU {procs.index((p, path))} failed (exit {p.exitcode})")
        r = json.loads(path.read_text())
        path.unlink()
        merged["entries"].update(r["entries"])
        for k, v in r["stats"].items():
            merged["stats"][k] = merged["stats"].get(k, 0) + v
        merged["per_device"].append({"device_index": r["device_index"], "wall_s": r["wall_s"],
                                     "compile_workers": r.get("compile_workers")})  # fmt: skip
        for k in ("space", "limits", "ceilings", "timing", "compile_budget", "compile_workers",
                  "vllm_kernel"):  # fmt: skip
            merged.setdefault(k, r.get(k))
        merged["resumed_log_records"] = r["resumed_log_records"]
        merged.setdefault("skipped_batch_sizes", []).extend(r["skipped_batch_sizes"])
    return merged


def _tuner_version() -> str:
    """The cellbench package version of the tuner that ran (it is mounted into the image)."""
    from cellbench import __version__

    return __version__


def _installed_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _csv_rows(plan: Plan, entries: dict[str, Any], cu_num: int | None) -> list[dict[str, Any]]:
    s = plan.shape
    act = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
    a = act[plan.act_dtype]
    q = "torch.float8_e4m3fn" if s.dtype == "fp8_w8a8" else a
    if s.dtype == "fp8_w8a8":
        qt = (
            f"QuantType.per_{s.block_shape[0]}x{s.block_shape[1]}"
            if s.block_shape
            else ("QuantType.per_Tensor")
        )
    else:
        qt = "QuantType.No"
    rows = []
    for m in sorted(entries, key=int):
        e = entries[m]
        name = e["config_name"]
        fused = e["roofline"]["fused"]
        err = e.get("error_vs_reference")
        if e.get("kernel_path") == "decode":  # both GEMMs in one launch: AITER's "1-stage"
            stages = {"us1": _r(e.get("gemms_us")), "err1": _r(err, 6), "us2": 0,
                      "kernelName1": f"cellbench_{plan.backend}_triton_1stage_{name}",
                      "kernelName2": "", "err2": None, "run_1stage": 1}  # fmt: skip
        else:
            stages = {"us1": _r(e.get("gemm1_us")), "err1": _r(err, 6),
                      "us2": _r(e.get("gemm2_us")), "err2": _r(err, 6), "run_1stage": 0,
                      "kernelName1": f"cellbench_{plan.backend}_triton_gemm1_{name}",
                      "kernelName2": f"cellbench_{plan.backend}_triton_gemm2_{name}"}  # fmt: skip
        rows.append(
            {
                "cu_num": cu_num,
                "token": int(m),
                "model_dim": s.hidden_size,
                "inter_dim": s.intermediate_size,
                "expert": s.num_experts,
                "topk": s.topk,
                "act_type": "ActivationType.Silu",
                "dtype": a,
                "q_dtype_a": q,
                "q_dtype_w": q,
                "q_type": qt,
                "use_g1u1": 1,
                "doweight_stage1": 0,
                "block_m": e["config"]["BLOCK_SIZE_M"],
                "ksplit": 0,
                **stages,
                "us": _r(e["time_us"]),
                "tflops": _r(_scaled(fused.get("achieved_flops_per_s"), 1e12), 4),
                "bw": _r(_scaled(fused.get("achieved_bytes_per_s"), 1e9), 2),
                "_tag": "interpreter" if not plan.on_gpu else "",
            }
        )
    return rows


def _scaled(v: float | None, unit: float) -> float | None:
    return None if v is None else v / unit


def _r(v: float | None, nd: int = 3) -> float | None:
    """Round to nd decimals, keeping at least 4 significant digits for small values."""
    if v is None:
        return None
    v = float(v)
    return round(v, nd) if abs(v) >= 10 ** (3 - nd) or v == 0 else float(f"{v:.4g}")


def _human(summary: dict[str, Any]) -> str:
    lines = [
        f"cellbench tune: {summary['config_file']} ({summary['backend']}, {summary['mode']} mode"
        f"{', INTERPRETER timings' if summary['interpreter'] else ''})",
        f"{'M':>6} {'time_us':>10} {'gemm1':>9} {'gemm2':>9} {'roofline':>8} {'vs base':>8}"
        "  config",
    ]
    for m, e in sorted(summary["entries"].items(), key=lambda kv: int(kv[0])):
        rf = e["roofline"]["fused"]["roofline_fraction"]
        g1, g2 = e.get("gemm1_us"), e.get("gemm2_us")
        lines.append(
            f"{m:>6} {e['time_us']:>10.2f} {g1 if g1 is None else round(g1, 2)!s:>9} "
            f"{g2 if g2 is None else round(g2, 2)!s:>9} "
            f"{'n/a' if rf is None else f'{rf:.2f}':>8} {_gain_text(e):>8}  {e['config_name']}"
        )
    if summary.get("kept_baseline"):
        sizes = ", ".join(map(str, summary["kept_baseline"]))
        lines.append(
            f"kept vLLM's own config (the pick was no faster side by side) at M = {sizes}; "
            "--keep all writes every pick"
        )
    st = summary["counts"]
    sec = summary["seconds"]
    lines.append(
        f"candidates: {st['timed']} timed, {st['reused']} reused from log, {st['pruned']} pruned, "
        f"{st['failed']} failed; seconds: wall {sec['wall']:.1f}, cpu {sec['cpu']:.1f}, "
        f"gpu {sec['gpu']:.1f}"
    )
    w = summary.get("compile_workers")
    if w and "ready" in w:
        lines.append(worker_line(w))
    return "\n".join(lines)


def _gain_text(entry: dict[str, Any]) -> str:
    """The pick's gain over the baseline (vLLM without the tuned file), e.g. '+12.3%'."""
    gain = entry.get("improvement_pct")
    if gain is None:
        return "n/a"
    return f"{gain:+.1f}%"


KEPT_PROGRESS = "[tune] kept"


def kept_line(m: int, timed: int, entry: dict[str, Any]) -> str:
    """One progress line per batch size once its baseline is timed: what was timed, what was
    kept, and what it gains over the config vLLM would use without the tuned file."""
    base = entry.get("baseline") or {}

    def us(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f} us"

    return (
        f"{KEPT_PROGRESS} M={m}: {timed} configs timed, kept {entry['config_name']} "
        f"{us(entry['time_us'])}; baseline ({base.get('source', 'n/a')}) "
        f"{us(base.get('time_us'))} vs the pick {us(base.get('tuned_time_us'))} side by side; "
        f"gain {_gain_text(entry)}"
    )


def worker_line(w: dict[str, Any]) -> str:
    """One line on the compile workers' start-up (`compile_workers` of the summary)."""
    return (
        f"compile workers ({'compile-only' if w.get('compile_only') else 'each opens the GPU'}):"
        f" ready {w['first_ready']:.1f}-{w['last_ready']:.1f} s after start (medians: process"
        f" up {w['worker_started']:.1f}, torch {w['torch_imported']:.1f}, kernels"
        f" {w['kernels_imported']:.1f}, ready {w['ready']:.1f})"
    )


def run(plan: Plan) -> dict[str, Any]:
    """Tune per the plan and write all artifacts (summary.json last); returns the summary."""
    import torch
    import triton

    from cellbench.common.atomicio import checksum_path
    from cellbench.tune.artifacts import (
        atomic_write_json,
        path_choices_file_name,
        write_path_choices,
        write_tuned_csv,
        write_vllm_config,
    )

    t0 = time.perf_counter()
    try:
        plan.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only file system, permissions: the user's path, not a bug
        raise OutputError(f"--out {plan.out}: cannot create it: {exc.strerror or exc}") from None
    (plan.out / SUMMARY_NAME).unlink(missing_ok=True)  # a rerun is not complete until it ends
    res = _run_all(plan)
    entries = res["entries"]
    kept_baseline = apply_keep(entries, plan.keep)
    config_file = plan.config_file
    write_vllm_config(
        plan.out / "configs",
        config_file,
        {int(m): e["config"] for m, e in entries.items()},
        triton.__version__,
        plan.platform == "rocm",
    )
    choices = {
        int(m): {**e["path_choice"], "config": e["config"]}
        for m, e in entries.items()
        if e.get("path_choice")
    }
    paths_file = plan.out / "configs" / path_choices_file_name(config_file)
    if choices:
        write_path_choices(plan.out / "configs", config_file, choices)
    else:  # a rerun that measured none must not leave an older run's choices in force
        paths_file.unlink(missing_ok=True)
        checksum_path(paths_file).unlink(missing_ok=True)
    cu = None
    if plan.on_gpu:
        cu = torch.cuda.get_device_properties(0).multi_processor_count
    write_tuned_csv(plan.out / CSV_NAME, _csv_rows(plan, entries, cu))
    st = res["stats"]  # cpu_s: each device process's own CPU time plus its compile workers'
    summary = {
        "shape": plan.shape.to_dict(),
        "device_name": plan.device_name,
        "config_file": config_file,
        "backend": plan.backend,
        "mode": plan.mode,
        "dtype": plan.dtype_label,
        "compute_dtype": plan.act_dtype,
        "compute_dtype_note": plan.act_note or None,
        "interpreter": not plan.on_gpu,
        "platform": plan.platform,
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "tuner_version": _tuner_version(),
        "python_version": platform.python_version(),
        # Read where the tuner runs (inside the image on docker): what shaped the numbers.
        "vllm_version": _installed_version("vllm"),
        # --backend vllm: which parts of the timed call were vLLM's, and from where
        "vllm_kernel": res.get("vllm_kernel"),
        "batch_sizes": plan.batch_sizes,
        "complete": not res.get("skipped_batch_sizes"),
        "skipped_batch_sizes": res.get("skipped_batch_sizes", []),
        "entries": entries,
        # Which picks the tuned file holds: those that beat vLLM's own config (default), or all.
        "keep": plan.keep,
        "kept_baseline": kept_baseline,
        "counts": {k: st.get(k, 0) for k in ("timed", "reused", "pruned", "failed")},
        "seconds": {
            "wall": time.perf_counter() - t0,
            "cpu": st.get("cpu_s", 0.0),
            "gpu": st.get("gpu_s", 0.0),
            "compile_cpu": st.get("compile_cpu_s", 0.0),
            "setup": st.get("setup_s", 0.0),
            "compile_wait": st.get("compile_wait_s", 0.0),
        },
        "compile_workers": res.get("compile_workers"),
        "space": res["space"],
        "hardware_limits": res["limits"],
        "ceilings": res["ceilings"],
        "timing": res["timing"],
        "max_configs": plan.max_configs,
        "compile_budget": list(opts_budget) if (opts_budget := res.get("compile_budget")) else None,
        "seed_configs": plan.argv[plan.argv.index("--seed-configs") + 1]
        if "--seed-configs" in plan.argv
        else None,
        "seed": plan.seed,
        "resumed_log_records": res["resumed_log_records"],
        "per_device": res.get("per_device"),
        "argv": plan.argv,
    }
    if not plan.on_gpu:
        summary["timing"]["note"] = (
            "Triton CPU interpreter wall-clock medians: they rank configs for the interpreter "
            "only and say nothing about GPU speed"
        )
    atomic_write_json(plan.out / SUMMARY_NAME, summary, checksum=True)
    print(_human(summary), flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input, 1 when tuning failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        plan = _validate(args, argv)
    except UsageError as e:
        print(f"cellbench tune: error: {e}", file=sys.stderr)
        return 2
    try:
        run(plan)
    except OutputError as e:
        print(f"cellbench tune: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report and fail the step; the log stays for resume
        print(f"cellbench tune: failed: {type(e).__name__}: {e}", file=sys.stderr)
        import traceback

        traceback.print_exc()
        return 1
    return 0
