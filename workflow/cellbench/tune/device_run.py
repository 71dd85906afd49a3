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
