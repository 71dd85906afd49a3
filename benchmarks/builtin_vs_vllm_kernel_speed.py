#!/usr/bin/env python3
"""The builtin fused-MoE kernel against vLLM 0.34's, variant by variant.

Shape: Qwen3-30B-A3B at TP=1 (E=128, N=768, K=2048, top-8), bf16 and fp8 block [128,128],
vLLM's 18 batch sizes, vLLM's shipped H200 configs (nearest batch-size key). Per batch size,
on the same four input sets: vLLM's kernel (run from its wheel's sources, as in
tuner_default_vs_exhaustive_vllm_kernel.py) and each builtin variant below, interleaved
CUDA-graph replays,
whole fused calls and the two GEMMs alone; every output is first checked against the float64
reference. A variant is a set of the kernel module's switches (`kernels.kernel_options`)
plus a path; "new" is the kernel's default now, "old" the switches as they were before
this change (alignment for every M, no operand swap, vector weight scales, unchained fp8
quantisation; on the old rule bf16 took the few-token path at M <= 4, which "decode" times).

Per dtype a table: per M, builtin/vLLM for each variant (whole call and GEMMs), the spread,
and the variant the default picks. Outputs OUT/builtin_vs_vllm_<gpu>_<dtype>.{json,txt}
(<gpu>: --gpu, default this device's name, e.g. h100; benchmarks/gpu_label.py).
The whole run stops starting batch sizes when --budget-s is spent (the table says which were
left out); batch sizes run in --order (the ones the issue names first).

`--smoke`: a tiny shape under the CPU interpreter, fp32 compute (a check that the script
runs end to end; its times mean nothing).

Usage: python benchmarks/builtin_vs_vllm_kernel_speed.py --out $OUT [--budget-s 240]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tuner_default_mode_cost as th  # noqa: E402 - shipped configs, batch sizes, number format
import tuner_default_vs_exhaustive_vllm_kernel as tv  # noqa: E402 - shipped file names, vLLM source folder
from gpu_label import add_gpu_argument, gpu_label  # noqa: E402

QWEN = {"bf16": ("bf16", None), "fp8": ("bf16", (128, 128))}
SMOKE = {"bf16": ("fp32", None), "fp8": ("fp32", (32, 32))}
OLD = {"NAIVE_ASSIGNMENT": False, "FP8_SWAP_AB": False, "FP8_SCALE_SCALAR": False,
       "CHAIN_QUANT": False}  # fmt: skip
# name -> (kernel options, path, which batch sizes, dtypes)
VARIANTS = {
    "new": ({}, "auto", None, ("bf16", "fp8")),
    "old": (OLD, "grouped", None, ("bf16", "fp8")),
    "decode": ({}, "decode", (1, 4), ("bf16",)),
    # bf16's "old" is exactly this (the other switches are fp8's)
    "aligned": ({"NAIVE_ASSIGNMENT": False}, "grouped", (1, 4), ("fp8",)),
    # the swap rule applies where the shipped configs have BLOCK_SIZE_M < 64 (M <= 256)
    "noswap": ({"FP8_SWAP_AB": False}, "grouped", (1, 256), ("fp8",)),
    "swap": ({"SWAP_AB_UNQUANTISED": True}, "grouped", (1, 256), ("bf16",)),
    "tma": ({"B_OPERAND_TMA": True}, "grouped", (1, 8), ("fp8",)),
    "persistent": ({"PERSISTENT_QUANTISED": True}, "grouped", (1024, 4096), ("fp8",)),
}
ORDER = [1, 2, 4, 1024, 4096, 8, 16, 2048, 256, 64, 32, 24, 48, 96, 128, 512, 1536, 3072]
SMOKE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 2}  # fmt: skip


def variants_at(m: int, dtype: str) -> list[str]:
    out = []
    for name, (_opts, _path, span, dts) in VARIANTS.items():
        if dtype in dts and (span is None or span[0] <= m <= span[1]):
            out.append(name)
    return out


def _warm_variant(opts: dict, m: int, cfg: dict, facts: dict):
    """In a compile-only worker (the tuner's, `tuner.compilepool`): compile one variant's
    kernels for m tokens with its switches set, without opening the GPU."""
    from cellbench.tune import compilepool as cp
    from cellbench.tune import kernels

    def work() -> None:
        cp._prepare_device(facts)
        w = cp._W
        with kernels.kernel_options(**opts):
            kernels.warm_config(w["shape"], m, w["act_dtype"], cfg, w["device"])
            kernels.warm_shared(w["shape"], m, w["act_dtype"], w["device"])
            kernels.warm_shared(w["shape"], m, w["act_dtype"], w["device"], cfg["BLOCK_SIZE_M"])

    return cp._reported(work)[:2]


def start_workers(n: int, shape, act: str):
    """Forked compile-only workers, started before this process opens the GPU (CUDA does not
    survive a fork); None when n < 1."""
    if n < 1:
        return None
    import concurrent.futures as cf
    import multiprocessing as mp

    from cellbench.tune import compilepool as cp

    pool = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("fork"), initializer=cp._init,
                                  initargs=("builtin", shape.to_dict(), act, 0, True,
                                            time.time()))  # fmt: skip
    cf.wait([pool.submit(cp._ready) for _ in range(n)])
    return pool


def prewarm(pool, kernels, be, ms: list[int], table_cfgs: dict, dtype: str, limit_s: float):
    """Compile every variant's kernels at every batch size in the workers, at most limit_s
    (what is left compiles on first use here). Returns (jobs, failed, seconds)."""
    import concurrent.futures as cf

    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    cap, sms = policy.device_facts(be.device)
    facts = {"capability": list(cap), "sm_count": sms}
    seen, futs = set(), []
    t = time.perf_counter()
    for m in ms:
        cfg = th.nearest(table_cfgs, m)
        for name in variants_at(m, dtype):
            opts, path, *_ = VARIANTS[name]
            if path == "decode":
                continue  # warm_config compiles the default path's kernels
            with kernels.kernel_options(**opts):
                choices = kernels.m_dependent_choices(m, be.shape.topk, be.base.quant,
                                                      be.shape.num_experts)  # fmt: skip
            pairs = m * be.shape.topk
            key = (json.dumps(opts, sort_keys=True), json.dumps(cfg, sort_keys=True),
                   str(choices), pairs == 1, pairs % 16 == 0)  # fmt: skip
            if key not in seen:
                seen.add(key)
                futs.append(pool.submit(_warm_variant, opts, m, cfg, facts))
    done, _ = cf.wait(futs, timeout=limit_s)
    failed = [f.result()[1] for f in done if not f.result()[0]]
    return len(futs), failed, time.perf_counter() - t


def _builtin_call(kernels, problem, cfg, name: str, gemms: bool):
    """A closure that runs one builtin variant with its switches set while it runs (so a
    CUDA graph captured around it holds that variant's kernels)."""
    opts, path, *_ = VARIANTS[name]
    run = kernels.run_gemms if gemms else kernels.run_fused

    def call():
        with kernels.kernel_options(**opts):
            return run(problem, cfg, path=path)

    return call


def one_m(be, kernels, m: int, cfg: dict, dtype: str, on_gpu: bool) -> dict:
    from cellbench.tune.candidates import rel_error
    from cellbench.tune.timing import time_side_by_side

    problems = [be.make_problem(m, 1000 + i) for i in range(4 if on_gpu else 2)]
    ref = be.reference(problems[0])
    res: dict = {"config": cfg}
    ok = []
    for name in ["vllm", *variants_at(m, dtype)]:
        try:
            if name == "vllm":
                got = be.output(problems[0], cfg)
            else:
                got = _builtin_call(kernels, problems[0], cfg, name, False)()
            err = rel_error(got, ref)
            if not err < be.error_bound:
                raise ValueError(f"error {err:.3g} over the bound {be.error_bound}")
            res[name] = {"error": err}
            ok.append(name)
        except Exception as e:  # noqa: BLE001 - reported in the table and the JSON
            res[name] = {"failed": f"{type(e).__name__}: {e}"[:300]}
            print(f"{dtype} M={m} {name}: {res[name]['failed']}", flush=True)
    for gemms, key in ((False, "call"), (True, "gemms")):
        sets = []
        for name in ok:
            if name == "vllm":
                make = be.gemms_call if gemms else be.call
                sets.append([make(p, cfg) for p in problems])
            else:
                calls = [_builtin_call(kernels, p, cfg, name, gemms) for p in problems]
                if gemms:
                    for c in calls:  # align/quantise once, outside the timed region
                        c()
                sets.append(calls)
        ts = time_side_by_side(sets, on_gpu=on_gpu, repeats=20 if on_gpu else 2)
        for name, t in zip(ok, ts, strict=True):
            res[name][f"{key}_us"] = t.median_us
            res[name][f"{key}_spread"] = t.spread
    v = res.get("vllm", {})
    for name in ok:
        if name != "vllm":
            for key in ("call", "gemms"):
                b, vv = res[name].get(f"{key}_us"), v.get(f"{key}_us")
                res[name][f"{key}_ratio"] = b / vv if b and vv else None
    with kernels.kernel_options():
        res["default_path"] = kernels.kernel_path(m, problems[0].quant, "auto", cfg)
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    pairs = m * be.shape.topk
    res["default_choices"] = {
        "naive": policy._naive(pairs, be.shape.num_experts),
        "swap_ab": policy._swap_ab(cfg, problems[0].quant, problems[0].w1),
        "tma": policy._use_b_descriptor(problems[0].w1, cfg, pairs),
        "persistent": policy._persistent(1, pairs, problems[0].quant is not None),
        "chained": policy._chain(problems[0].hidden_states, pairs),
    }
    return res


def table(dtype: str, ms: list[int], sbs: dict, left_out: list[int], parts=None,
          device: str = "") -> str:  # fmt: skip
    f = th.fmt
    names = [n for n in VARIANTS if dtype in VARIANTS[n][3]]
    lines = [
        f"== {dtype}: builtin kernel / vLLM 0.34 kernel, vLLM's shipped H200 configs, "
        f"same inputs (graph replays, interleaved; < 1: builtin faster), {device}"
    ]
    # whose op each part of the vLLM column is (vLLM's compiled op, or the project's and why)
    lines.append("vllm column: GEMMs, launcher, few-token rule: vLLM 0.34 (wheel's Python)")
    for part, who in (parts or {}).items():
        lines.append(f"vllm column: {part}: {who}")
    lines.append("builtin columns: every op the project's")
    lines.append("whole call: " + ", ".join(f"{n}" for n in names) + " | GEMMs alone: same")
    head = f"{'M':>5} {'vllm us':>8} | " + " ".join(f"{n:>10}" for n in names)
    lines.append(head + " | " + " ".join(f"{n:>10}" for n in names) + " | spread | default")
    for m in ms:
        s = sbs.get(m)
        if s is None:
            continue
        calls = " ".join(f"{f(s.get(n, {}).get('call_ratio'), 3):>10}" for n in names)
        gem = " ".join(f"{f(s.get(n, {}).get('gemms_ratio'), 3):>10}" for n in names)
        spread = max((x.get("call_spread", 0) for x in s.values() if isinstance(x, dict)
                      and "call_spread" in x), default=None)  # fmt: skip
        ch = s.get("default_choices", {})
        picks = [s.get("default_path", "-")] + [k for k, v in ch.items() if v is True]
        lines.append(f"{m:>5} {f(s.get('vllm', {}).get('call_us')):>8} | {calls} | {gem} | "
                     f"{f(spread, 3):>6} | {'+'.join(picks)}")  # fmt: skip
    new = [sbs[m]["new"]["call_ratio"] for m in ms
           if m in sbs and sbs[m].get("new", {}).get("call_ratio")]  # fmt: skip
    if new:
        lines.append(
            f"default (new) whole call / vLLM: {min(new):.3f}-{max(new):.3f}; "
            f"<= 1.00 at {sum(r <= 1.0 for r in new)} of {len(new)} batch sizes"
        )
    if left_out:
        lines.append(f"not timed (budget spent): M={','.join(map(str, left_out))}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape under the CPU interpreter")
    ap.add_argument("--dtypes", default=None, help="comma list of bf16, fp8 (smoke: bf16)")
    ap.add_argument("--batch-sizes", default=None, help="default: vLLM's 18 (smoke: 1,8)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="wall budget of the script")
    ap.add_argument("--vllm-source", default=os.environ.get("CELLBENCH_VLLM_SOURCE")
                    or str(tv.DEFAULT_SOURCE), help="folder of vLLM's sources")  # fmt: skip
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/tmp")
    add_gpu_argument(ap)
    ap.add_argument("--compile-workers", type=int, default=12,
                    help="on a GPU: forked compile-only workers warming every variant's "
                    "kernels before a dtype is timed (0: compile on first use)")  # fmt: skip
    ap.add_argument("--prewarm-s", type=float, default=60.0,
                    help="longest wait for the workers per dtype")  # fmt: skip
    a = ap.parse_args()
    t0 = time.perf_counter()
    dtypes = [x for x in (a.dtypes or ("bf16" if a.smoke else "bf16,fp8")).split(",") if x]
    if not dtypes or any(x not in QWEN for x in dtypes):
        print(f"--dtypes={a.dtypes!r}: expected a comma list of bf16, fp8", file=sys.stderr)
        return 2
    try:
        ms_all = [int(x) for x in (a.batch_sizes or ("1,8" if a.smoke else
                  ",".join(map(str, th.VLLM_DEFAULT)))).split(",")]  # fmt: skip
    except ValueError:
        print(f"--batch-sizes={a.batch_sizes!r}: expected a comma list of integers",
              file=sys.stderr)  # fmt: skip
        return 2
    if any(m < 1 for m in ms_all):
        print(f"--batch-sizes={a.batch_sizes!r}: batch sizes must be >= 1", file=sys.stderr)
        return 2
    ms = sorted(ms_all, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m))
    refusal = tv.prepare_run(a.vllm_source, a.smoke)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    import torch
    import triton
    from cellbench.tune import kernels
    from cellbench.tune.backends import VllmBackend
    from cellbench.tune.shapes import MoEShape

    on_gpu = torch.cuda.is_available()
    status = 0
    shapes = {}
    for dtype in dtypes:
        act, block = (SMOKE if a.smoke else QWEN)[dtype]
        dims = (8, 32, 64, 2) if a.smoke else (128, 768, 2048, 8)
        shapes[dtype] = (MoEShape(*dims, "fp8_w8a8" if block else None, block), act)
    # the workers fork before this process opens the GPU (asking the device name opens it)
    pools = {d: start_workers(a.compile_workers if on_gpu else 0, *shapes[d]) for d in dtypes}
    out = Path(a.out)
    gpu = gpu_label(a.gpu)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        **th.run_meta(torch, triton, on_gpu),
        "vllm_source": tv.source_record(a.vllm_source),
        "smoke": a.smoke,
        "batch_sizes": ms_all,
        "budget_s": a.budget_s,
        "compile_workers": a.compile_workers if on_gpu else 0,
        "variants": {
            n: {"options": o, "path": p, "ms": s, "dtypes": d}
            for n, (o, p, s, d) in VARIANTS.items()
        },  # fmt: skip
    }
    print("\n".join(f"{k}: {v}" for k, v in meta.items()), flush=True)
    for i, dtype in enumerate(dtypes):
        shape, act = shapes[dtype]
        if a.smoke:
            table_cfgs = {1: SMOKE_CONFIG}
        else:
            table_cfgs = th.shipped_configs(tv.SHIP[dtype])
            if table_cfgs is None:
                print(f"{dtype}: no shipped config file {tv.SHIP[dtype]} in {th.REF_DIR}",
                      file=sys.stderr)  # fmt: skip
                status = 1
                continue
        be = VllmBackend(shape, act, "cuda" if on_gpu else "cpu")
        warm = None
        if pools.get(dtype) is not None:
            jobs, failed, secs = prewarm(pools[dtype], kernels, be, ms, table_cfgs, dtype,
                                         a.prewarm_s)  # fmt: skip
            pools[dtype].shutdown(wait=False, cancel_futures=True)
            warm = {"jobs": jobs, "failed": failed[:5], "n_failed": len(failed),
                    "wall_s": round(secs, 1)}  # fmt: skip
            print(f"{dtype}: prewarm {warm}", flush=True)
        # the dtypes share what is left of the budget
        now = time.perf_counter()
        deadline = now + (a.budget_s - (now - t0)) / (len(dtypes) - i)
        sbs: dict = {}
        left_out: list[int] = []
        for m in ms:
            if time.perf_counter() > deadline:
                left_out.append(m)
                continue
            t_m = time.perf_counter()
            sbs[m] = one_m(be, kernels, m, th.nearest(table_cfgs, m), dtype, on_gpu)
            sbs[m]["wall_s"] = round(time.perf_counter() - t_m, 2)
            if on_gpu:
                torch.cuda.empty_cache()
        ordered = sorted(ms_all)
        parts = be.kernel_record().get("parts")
        txt = table(dtype, ordered, sbs, left_out, parts, meta["device"])
        stem = out / f"builtin_vs_vllm_{gpu}_{dtype}"
        result = {"meta": {**meta, "shape": shape.to_dict(), "act_dtype": act, "prewarm": warm,
                           "vllm_kernel": be.kernel_record()},
                  "side_by_side": {str(k): v for k, v in sorted(sbs.items())},
                  "not_timed": left_out}  # fmt: skip
        from cellbench.common import atomicio

        atomicio.write_json(stem.with_suffix(".json"), result)
        header = "\n".join(f"{k}: {v}" for k, v in meta.items() if k != "variants")
        atomicio.write_text(stem.with_suffix(".txt"), f"{header}\n{txt}\n")
        print(txt, flush=True)
        failed = [f"M={m} {n}" for m, s in sbs.items() for n, x in s.items()
                  if isinstance(x, dict) and "failed" in x]  # fmt: skip
        if failed:
            print(f"{dtype}: failed: {', '.join(failed)}", flush=True)
            status = 1
        del be
    print(f"total wall {time.perf_counter() - t0:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
