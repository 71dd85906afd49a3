"""The tuner's command line read and checked into a `Plan`, before any GPU work.

In-container module: stdlib + torch (+ vllm probed for --backend vllm).

Split from cli.py (issue 31 item 4): the arguments, the batch-size tiers and every refusal
(`UsageError`, exit status 2) live here, so the config loader can read the tiers without the
run loop, and cli.py is left with the run itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellbench.tune.shapes import add_shape_arguments

__all__ = ["Plan", "parse_batch_sizes", "BATCH_SIZE_TIERS", "KEEP_CHOICES", "UsageError"]

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
