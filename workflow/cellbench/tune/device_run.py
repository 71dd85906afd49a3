"""The tuning itself: a plan's batch sizes tuned on each device, and the devices' results merged.

In-container module: stdlib + torch + triton (+ vllm for --backend vllm).

Split from cli.py: the search's options for the plan, the candidate space,
one device's run (compile workers, the search, each pick's GEMM timings, roofline and baseline)
and, with several GPUs, one spawned process per GPU over contiguous chunks of batch sizes.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from cellbench.tune.outputs import LOG_NAME, kept_line
from cellbench.tune.plan import Plan


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


def candidate_space(plan: Plan):
    """The candidate configs for the plan's platform, with the space's name."""
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


def _start_pool(plan: Plan, opts: Any, device_index: int) -> Any:
    """The compile workers (None without them), started first: they import and initialise
    while this process builds weights."""
    if not (plan.on_gpu and opts.compile_workers > 0):
        return None
    from cellbench.tune.compilepool import CompilePool

    return CompilePool(
        opts.compile_workers, plan.backend, plan.shape.to_dict(), plan.act_dtype, device_index
    )


def _open_device(plan: Plan, device_index: int, pool: Any) -> Any:
    """The torch device this process tunes on (the pool told its facts where it compiles
    only); on CPU, every core for the interpreter."""
    import torch

    if not plan.on_gpu:
        torch.set_num_threads(max(os.cpu_count() or 1, 1))
        return torch.device("cpu")
    torch.cuda.set_device(device_index)
    device = torch.device("cuda", device_index)
    if pool is not None and pool.compile_only:
        from cellbench.tune.kernels.launch_policy import device_facts

        pool.assume_device(*device_facts(device))
    return device


def _ceilings(plan: Plan, device: Any, backend: Any) -> Any:
    """The device's copy and matmul ceilings (fp8 matmul for an fp8 shape); none on CPU."""
    from cellbench.tune import roofline

    if not plan.on_gpu:
        return roofline.Ceilings(None, None)
    ceil = roofline.measure_ceilings(device)
    if plan.shape.dtype == "fp8_w8a8":
        fp8 = roofline.measure_ceilings(device, backend.base.w1.dtype)
        ceil = roofline.Ceilings(ceil.copy_bytes_per_s, fp8.matmul_flops_per_s,
                                 fp8.matmul_dtype, fp8.note)  # fmt: skip
    return ceil


def _pick_details(
    plan: Plan, opts: Any, backend: Any, entries: dict[int, Any], ceil: Any
) -> dict[int, dict[str, Any]]:
    """Each pick with its GEMM timings and roofline, vLLM's config timed beside it, and (the
    builtin kernel) its measured path choice."""
    from cellbench.tune.baseline import baseline_source, measure, seed_path

    src = baseline_source(plan.config_file, plan.seed_table, seed_path(plan.seed_configs))
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
    return details


def _final_stats(stats: Any, pool: Any, cpu_self_s: float, setup_s: float) -> Any:
    """The run's counters with its CPU seconds (this process's and the workers'), its setup
    and its wait for the workers."""
    if pool is not None:
        stats.compile_cpu_s = pool.cpu_s
    stats.cpu_s = cpu_self_s + stats.compile_cpu_s
    stats.setup_s = setup_s
    if pool is not None:
        stats.compile_wait_s = pool.wait_s
    return stats


def _workers(pool: Any) -> dict[str, Any] | None:
    """The workers' start-up in seconds after the pool was created (see the pool)."""
    if pool is None:
        return None
    workers: dict[str, Any] = {k: round(v, 3) for k, v in pool.startup().items()}
    workers["compile_only"] = pool.compile_only
    return workers


def _run_device(plan: Plan, batch_sizes: list[int], device_index: int) -> dict[str, Any]:
    """Tune `batch_sizes` on one device (GPU index or CPU); returns JSON-ready results."""
    from cellbench.tune import spaces
    from cellbench.tune.artifacts import TuningLog
    from cellbench.tune.backends import make_backend
    from cellbench.tune.search import build_tuner

    t_wall = time.perf_counter()
    c_self = time.process_time()
    opts = _options(plan)
    pool = _start_pool(plan, opts, device_index)
    try:
        device = _open_device(plan, device_index, pool)
        backend = make_backend(
            plan.backend, plan.shape, plan.act_dtype, device, seed=plan.seed,
            vllm_source=plan.vllm_source,
        )  # fmt: skip
        space_name, space = candidate_space(plan)
        limits = spaces.HardwareLimits.detect()
        log = TuningLog(plan.out / LOG_NAME)
        setup_s = time.perf_counter() - t_wall
        tuner = build_tuner(
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
        ceil = _ceilings(plan, device, backend)
        details = _pick_details(plan, opts, backend, entries, ceil)
    finally:
        if pool is not None:
            pool.close()
    stats = _final_stats(tuner.stats, pool, time.process_time() - c_self, setup_s)
    return {
        "entries": {str(m): d for m, d in details.items()},
        "compile_workers": _workers(pool),
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


def split_batch_sizes(ms: list[int], parts: int) -> list[list[int]]:
    """Contiguous chunks (warm starts stay within a chunk), balanced by count."""
    parts = max(1, min(parts, len(ms)))
    size = math.ceil(len(ms) / parts)
    return [ms[i : i + size] for i in range(0, len(ms), size)]


def run_all(plan: Plan) -> dict[str, Any]:
    import torch

    ngpu = torch.cuda.device_count() if plan.on_gpu else 0
    if ngpu <= 1 or len(plan.batch_sizes) == 1:
        return _run_device(plan, plan.batch_sizes, 0)
    chunks = split_batch_sizes(plan.batch_sizes, ngpu)
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
