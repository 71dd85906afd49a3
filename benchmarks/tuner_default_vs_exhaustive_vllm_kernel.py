#!/usr/bin/env python3
"""The tuner's wall and picks on vLLM's own fused-MoE Triton kernel (the tuner's target there).

Target: default mode's picks within 1 % of exhaustive's at M <= 256 and within noise above,
never slower than the shipped config beyond noise, in at most a tenth of exhaustive's wall
(bf16), all 18 batch sizes of one shape in at most 2 minutes of wall.

Shape: Qwen3-30B-A3B at TP=1 (E=128, N=768, K=2048, top-8), bf16 first, then fp8 block
[128,128] only if its runs fit the budget left, over vLLM's 18 default batch sizes. vLLM is
not installed on the H200 machine: its kernel and launcher run from the Python files of vLLM's
wheel (workflow/scripts/vllm-kernel-src.sh, carried as .vllm-src/vllm-0.34.0), with the
project's alignment, SiLU-and-mul, activation quantisation and top-k sum around them
(`cellbench.tune.vllm_source`). Per dtype:

1. `cellbench.tune --backend vllm --mode default` at all batch sizes, seeded with vLLM's
   shipped H200 config (a fresh Triton cache that this process then shares); its summary
   gives each batch size's tuning wall and its own side-by-side re-time of the pick against
   the shipped config;
2. `--mode exhaustive` (fresh Triton cache) at a subset of batch sizes: a full sweep of vLLM's
   space over the 18 takes ~22 min in bf16 (17,344 timings at ~0.077 s, counted with
   --count-only), so with --exhaustive-ms auto the first set of EXH_SETS that fits the budget
   left (see there why these); the table gives default/exhaustive tuning wall over exactly
   those batch sizes (measured) and, marked as an estimate, over all 18 (exhaustive's measured
   seconds per timing times the timings counted on the CPU);
3. per batch size, the exhaustive ones first, on the same inputs, interleaved CUDA-graph
   replays of vLLM's kernel with default's pick, the shipped config and exhaustive's pick,
   each output checked against the float64 reference first; with --builtin also the builtin
   kernel with the same configs (benchmarks/builtin_vs_vllm_kernel_speed.py is that comparison).

A table after each stage (a run cut short keeps what it measured), ending with the targets
judged on the run's figures. Outputs: OUT/tuner_vllm_kernel_<gpu>_<dtype>.json and
.txt (<gpu>: --gpu, default this device's name, e.g. h100; benchmarks/gpu_label.py) with the
date, device, versions and vLLM source, the tuning logs, and the printed tables.

`--smoke` runs the same code on a tiny shape under the CPU interpreter (fp32 compute): a check
that the script runs, not a measurement. `--count-only` needs neither GPU nor vLLM sources.

Usage: python benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py --out $OUT [--budget-s 270]
       python benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py --count-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tuner_default_mode_cost as th  # noqa: E402 - the tuner runs and shipped-config helpers
from gpu_label import add_gpu_argument, gpu_label  # noqa: E402
from tuner_walls_table import _ms, _ratio, table, walls  # noqa: E402

SHIP = {
    "bf16": "E=128,N=768,device_name=NVIDIA_H200.json",
    "fp8": "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
}
DEFAULT_SOURCE = ROOT / ".vllm-src" / "vllm-0.34.0"
ESTIMATE_DIR = ROOT / "benchmarks" / "results" / "tuner_vllm_kernel_h200_2026-12-04"

# Planning figures, only to decide what fits the wall budget (never reported as results), from
# the H200 run of 2026-12-04 (ESTIMATE_DIR, 12 compile workers): exhaustive mode spent 53.7 s
# on 696 timings in bf16 and 20.8 s on 264 in fp8 at M=1,16 (0.077-0.079 s each; the builtin
# kernel's exhaustive runs of 2026-12-03 took 0.076 s at M=256 in bf16), and each run's process
# lived 4.1 s beyond its own wall; default mode's 18-M run took 86 s (bf16) and 63 s (fp8) as
# a process; the side-by-side re-time of three configs at one batch size takes a second or two.
PLAN_EXH_S_PER_TIMING = 0.078
PLAN_RUN_START_S = 6.0
PLAN_DEFAULT_RUN_S = {"bf16": 90.0, "fp8": 66.0}
PLAN_SBS_S_PER_M = 2.5
PLAN_MARGIN_S = 8.0
# Exhaustive batch-size sets, tried in this order, the first that fits the budget left: each
# holds a few-row batch size and (all but the last two) one of the largest pruning class (M >=
# 256 keeps 1,384 of bf16's 1,920 configs, at 7 of the 18 batch sizes, more than half of a full
# exhaustive sweep's timings). M=16 stands for the few-row batch sizes where only one fits:
# default mode's M=1 also carries its whole run's start (compile workers starting, correctness
# checks against the reference), which an 18-M run spreads over all its batch sizes.
EXH_SETS = ((1, 16, 256, 4096), (16, 256, 4096), (16, 256), (16, 64), (16,))
FINALISTS = 4  # TuneOptions.finalists: exhaustive mode re-times its best four side by side


def exhaustive_timings(dtype: str, ms, smoke: bool, limits=None) -> dict[int, int]:
    """Timings exhaustive mode takes per batch size on vLLM's kernel (no GPU needed): the
    configs of vLLM's space (the `vllm` backend's) that survive the tuner's pruning, plus its
    finalists re-timed. Every config is its own kernel there (no key is ignored), so this is
    also its compile count. Failures at run time (a few at M >= 1024 in bf16) come off."""
    from cellbench.tune import spaces

    if limits is None:  # an H200 with the Triton of the 2026-12-04 run
        limits = spaces.HardwareLimits(spaces.H200_SMEM_BYTES, "cuda", "3.6.0")
    model = th.TINY if smoke else th.QWEN3_30B
    n, k = model["moe_intermediate_size"], model["hidden_size"]
    block = None if dtype == "bf16" else ((32, 32) if smoke else (128, 128))
    space = spaces.tiny_space(block) if smoke else spaces.cuda_space(block)
    out = {}
    for m in ms:
        kept, _ = spaces.prune(space, m=m, n=n, k=k, operand_bytes=2 if dtype == "bf16" else 1,
                               limits=limits)  # fmt: skip
        out[m] = len(kept) + min(FINALISTS, len(kept))
    return out


def plan_exhaustive_s(timings: dict[int, int], ems) -> float:
    return PLAN_RUN_START_S + PLAN_EXH_S_PER_TIMING * sum(timings[m] for m in ems)


def choose_exhaustive_ms(timings: dict[int, int], ms, left_s: float) -> list[int]:
    """The first of EXH_SETS (batch sizes of this run only) whose planned exhaustive run and
    side-by-side re-time fit in left_s; [] when none does."""
    for ems in EXH_SETS:
        if all(m in ms for m in ems):
            need = plan_exhaustive_s(timings, ems) + PLAN_SBS_S_PER_M * len(ems)
            if need <= left_s:
                return list(ems)
    return []


def prepare_run(folder: str, smoke: bool) -> str | None:
    """Point the vLLM backend at the wheel's Python sources in ``folder`` (for --smoke, the
    interpreter first: it must be chosen before Triton decorates any kernel) and check there
    is a GPU unless smoking. Returns the refusal to print, or None when the run can start."""
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from cellbench.tune.vllm_source import SOURCE_ENV, check_source_dir

    bad = check_source_dir(folder)
    if bad is not None:
        return f"--vllm-source: {bad}"
    os.environ[SOURCE_ENV] = str(Path(folder).resolve())
    import torch

    if not smoke and not torch.cuda.is_available():
        return "no GPU: run with --smoke for the CPU check"
    return None


def source_record(folder: str) -> dict | str:
    """What vllm-kernel-src.sh recorded about the sources (wheel, sha256, files), or the path."""
    rec = Path(folder) / "SOURCE.json"
    return json.loads(rec.read_text()) if rec.is_file() else folder


def _calls(be, kernels, problems, cfg, kernel: str, path: str, gemms: bool):
    """Closures over the input sets: vLLM's kernel (the backend) or the builtin one."""
    if kernel == "vllm":
        make = be.gemms_call if gemms else be.call
        return [make(p, cfg) for p in problems]
    if gemms:
        for p in problems:  # align/quantise once, outside the timed region
            kernels.run_gemms(p, cfg, path=path)
        return [lambda p=p: kernels.run_gemms(p, cfg, path=path) for p in problems]
    return [lambda p=p: kernels.run_fused(p, cfg, path=path) for p in problems]


def _builtin_pool(be, ms, picks, workers: int):
    """Compile-only workers warming the builtin kernel's configs for every batch size up front
    (vLLM's were compiled by the tuner runs, into the Triton cache this process shares)."""
    if workers < 1:
        return None
    from cellbench.tune.compilepool import CompilePool
    from cellbench.tune.kernels.launch_policy import device_facts

    pool = CompilePool(workers, "builtin", be.shape.to_dict(), be.act_dtype, 0)
    pool.assume_device(*device_facts(be.device))
    for m in ms:
        pool.prefetch(m, list(picks.get(m, {}).values()))
    return pool


def side_by_side(
    be, ms, picks, on_gpu: bool, deadline: float, workers: int = 0, builtin: bool = False
) -> tuple[dict, list[int]]:
    """Per batch size, in the order of `ms`: every named config on vLLM's kernel (and with
    `builtin` on the builtin kernel too, whole calls and GEMMs alone), same inputs,
    interleaved. Returns (results, batch sizes left out because the deadline passed)."""
    import torch
    from cellbench.tune import kernels
    from cellbench.tune.candidates import rel_error
    from cellbench.tune.timing import time_side_by_side

    out: dict[int, dict] = {}
    left_out = []
    pool = _builtin_pool(be, ms, picks, workers) if on_gpu and builtin else None
    try:
        for m in ms:
            _one_m(be, kernels, m, picks, on_gpu, deadline, pool, out, left_out,
                   rel_error, time_side_by_side, builtin)  # fmt: skip
            if on_gpu:
                torch.cuda.empty_cache()
    finally:
        if pool is not None:
            pool.close()
    return out, left_out


def _one_m(be, kernels, m, picks, on_gpu, deadline, pool, out, left_out, rel_error, tsbs,
           builtin):  # fmt: skip
    """One batch size of `side_by_side` (results into `out`, or m into `left_out`)."""
    named = picks.get(m, {})
    if not named:
        return
    if time.perf_counter() > deadline:
        left_out.append(m)
        return
    if pool is not None:
        for cfg in named.values():
            pool.wait(m, cfg)
    problems = [be.make_problem(m, 1000 + i) for i in range(4 if on_gpu else 2)]
    ref = be.reference(problems[0])
    auto = kernels.kernel_path(m, problems[0].quant)
    rows = []  # (label, config name, kernel, path)
    for name in named:
        rows.append((f"vllm:{name}", name, "vllm", "auto"))
        if not builtin:
            continue
        rows.append((f"builtin:{name}", name, "builtin", "auto"))
        if auto == "decode":
            rows.append((f"builtin-grouped:{name}", name, "builtin", "grouped"))
    res: dict[str, dict] = {}
    ok = []
    for label, name, kernel, path in rows:
        cfg = named[name]
        try:
            got = (
                be.output(problems[0], cfg)
                if kernel == "vllm"
                else kernels.run_fused(problems[0], cfg, path=path)
            )
            err = rel_error(got, ref)
            if not err < be.error_bound:
                raise ValueError(f"error {err:.3g} over the bound {be.error_bound}")
            ok.append((label, name, kernel, path))
            ran = auto if path == "auto" and kernel == "builtin" else path
            res[label] = {"config": cfg, "error": err, "kernel": kernel, "path": ran}
        except Exception as e:  # noqa: BLE001 - reported in the table and the JSON
            res[label] = {"config": cfg, "failed": f"{type(e).__name__}: {e}"[:300]}
            print(f"M={m} {label}: cannot run {cfg}: {res[label]['failed']}", flush=True)
    # the GEMMs alone only serve the builtin/vLLM ratios
    for gemms, key in ((False, "call"), (True, "gemms"))[: 2 if builtin else 1]:
        sets = []
        for _label, name, kernel, path in ok:
            sets.append(_calls(be, kernels, problems, named[name], kernel, path, gemms))
        ts = tsbs(sets, on_gpu=on_gpu, repeats=30 if on_gpu else 3)
        for (label, *_), t in zip(ok, ts, strict=True):
            res[label][f"{key}_us"] = t.median_us
            res[label][f"{key}_spread"] = t.spread
    # builtin over vLLM, per config, same inputs (< 1: the builtin kernel is faster)
    for name in named:
        v = res.get(f"vllm:{name}", {})
        for prefix in ("builtin", "builtin-grouped"):
            b = res.get(f"{prefix}:{name}", {})
            for key in ("call", "gemms"):
                r = _ratio(b.get(f"{key}_us"), v.get(f"{key}_us"))
                if r is not None:
                    res.setdefault("ratios", {})[f"{prefix}/vllm:{name}:{key}"] = r
    out[m] = res


def count_only(dtypes, ms, estimate_dir: Path) -> int:
    """Exhaustive mode's timings per batch size (counted on the CPU) and, from a recorded run
    at estimate_dir, the walls they imply; no GPU, no vLLM sources."""
    for dtype in dtypes:
        t = exhaustive_timings(dtype, ms, False)
        per_m = ", ".join(f"{m}:{t[m]}" for m in ms)
        print(f"== {dtype}: exhaustive timings per M on vLLM's space (pruned, + {FINALISTS} "
              f"finalists): {per_m}; total {sum(t.values())}")  # fmt: skip
        # A recorded run of any GPU (the committed one, the default folder, is the H200's).
        found = sorted(estimate_dir.glob(f"tuner_vllm_kernel_*_{dtype}.json"))
        rec = found[0] if found else estimate_dir / f"tuner_vllm_kernel_<gpu>_{dtype}.json"
        if not rec.is_file():
            print(f"   (no recorded run at {rec}: counts only)")
            continue
        r = json.loads(rec.read_text())
        d, e = r["default"], r.get("exhaustive") or {}
        t = exhaustive_timings(dtype, sorted({*ms, *map(int, d["entries"])}), False)
        ems = [int(m) for m in e.get("entries", {})]
        w = walls(d, e, ems, t)
        de = d["entries"]
        print(f"   recorded ({rec.parent.name}): default per-M wall "
              + ", ".join(f"{m}:{de[str(m)]['tune_wall_s']:.1f}" for m in ms if str(m) in de)
              + f"; whole run {d['seconds']['wall']:.1f} s")  # fmt: skip
        if not w:
            continue
        print(f"   exhaustive measured at M={_ms(w['covered'])}: {w['exhaustive_s']:.1f} s "
              f"= {w['exhaustive_s_per_timing']:.4f} s per timing; default there "
              f"{w['default_s']:.1f} s; ratio {w['ratio']:.3f}")  # fmt: skip
        print(f"   estimate: exhaustive at all {len(w['all_ms'])} M ~ "
              f"{w['exhaustive_all_estimated_s']:.0f} s; default's whole run / that = "
              f"{w['ratio_all_estimated']:.3f}")  # fmt: skip
        per = w["exhaustive_s_per_timing"]
        for ems_ in EXH_SETS + ((1, 256), (1, 16)):
            if all(str(m) in de for m in ems_):
                dw = sum(de[str(m)]["tune_wall_s"] for m in ems_)
                ew = per * sum(t[m] for m in ems_)
                print(f"   at M={_ms(ems_)}: default {dw:.1f} s (measured) / exhaustive ~{ew:.0f} "
                      f"s (estimated) = {dw / ew:.3f}; planned exhaustive run "
                      f"{plan_exhaustive_s(t, ems_):.0f} s")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape under the CPU interpreter")
    ap.add_argument(
        "--count-only",
        action="store_true",
        help="print exhaustive mode's timings per batch size (CPU) and the walls they imply "
        "from the run recorded at --estimate-from; no GPU",
    )
    ap.add_argument("--estimate-from", default=str(ESTIMATE_DIR), help="with --count-only")
    ap.add_argument(
        "--dtypes",
        default=None,
        help="comma list of bf16, fp8 (default both, bf16 first; fp8 runs only if its default "
        "run and re-time fit the budget left; smoke: bf16, since under the interpreter "
        "fp8 outputs miss the fp8 error bound and Triton 3.9 rejects vLLM's scalar-scale branch)",
    )
    ap.add_argument("--batch-sizes", default=None, help="default: vLLM's 18 (smoke: 1,8)")
    ap.add_argument(
        "--exhaustive-ms",
        default="auto",
        help="comma list, '' to skip exhaustive, or 'auto' (default): the first set of "
        f"{' '.join(_ms(x) for x in EXH_SETS)} that fits the budget left (smoke: the first M)",
    )
    ap.add_argument("--budget-s", type=float, default=250.0, help="wall budget of the script")
    ap.add_argument("--default-budget-s", type=float, default=120.0, help="per dtype")
    ap.add_argument(
        "--builtin",
        action="store_true",
        help="also re-time the picks on the builtin kernel (whole call and GEMMs alone); "
        "benchmarks/builtin_vs_vllm_kernel_speed.py is the builtin-vs-vLLM comparison",
    )
    ap.add_argument(
        "--compile-workers",
        type=int,
        default=12,
        help="on a GPU: the tuner's (each runs vLLM's kernel once per candidate, on the GPU) "
        "and, with --builtin, the side-by-side stage's (compile-only, builtin kernel)",
    )
    ap.add_argument("--vllm-source", default=os.environ.get("CELLBENCH_VLLM_SOURCE")
                    or str(DEFAULT_SOURCE), help="folder of vLLM's sources")  # fmt: skip
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/tmp")
    add_gpu_argument(ap)
    a = ap.parse_args()
    t_start = time.perf_counter()
    dtypes = [x for x in (a.dtypes or ("bf16" if a.smoke else "bf16,fp8")).split(",") if x]
    if not dtypes or any(x not in SHIP for x in dtypes):
        print(f"--dtypes={a.dtypes!r}: expected a comma list of bf16, fp8", file=sys.stderr)
        return 2
    default_ms = "1,8" if a.smoke else ",".join(map(str, th.VLLM_DEFAULT))
    try:
        ms = sorted({int(x) for x in (a.batch_sizes or default_ms).split(",")})
        auto_ems = a.exhaustive_ms.strip() == "auto"
        ems = [] if auto_ems else [int(x) for x in a.exhaustive_ms.split(",") if x.strip()]
    except ValueError as e:
        print(f"--batch-sizes/--exhaustive-ms: {e}; expected comma lists of integers "
              "(--exhaustive-ms also 'auto' or '')", file=sys.stderr)  # fmt: skip
        return 2
    if any(m < 1 for m in ms) or any(m not in ms for m in ems):
        print(f"--exhaustive-ms={a.exhaustive_ms!r}: expected batch sizes >= 1 among "
              f"--batch-sizes ({_ms(ms)})", file=sys.stderr)  # fmt: skip
        return 2
    if a.count_only:
        return count_only(dtypes, ms, Path(a.estimate_from))
    refusal = prepare_run(a.vllm_source, a.smoke)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    import torch
    import triton
    from cellbench.tune.backends import VllmBackend
    from cellbench.tune.shapes import MoEShape
    from cellbench.tune.spaces import HardwareLimits

    on_gpu = torch.cuda.is_available()
    limits = HardwareLimits.detect()
    out = Path(a.out)  # made only once the input is known good
    a.gpu = gpu_label(a.gpu)  # the output names' GPU
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tuner-vllm-bench-"))
    model_cfg = work / "config.json"
    model_cfg.write_text(json.dumps(th.TINY if a.smoke else th.QWEN3_30B))
    meta = {
        **th.run_meta(torch, triton, on_gpu),
        "cpus": os.cpu_count(),
        "vllm_source": source_record(a.vllm_source),
        "smoke": a.smoke,
        "batch_sizes": ms,
        "exhaustive_batch_sizes": "auto" if auto_ems else ems,
        "budget_s": a.budget_s,
        "compile_workers": a.compile_workers if on_gpu else 0,
        "builtin_kernel_retimed": a.builtin,
    }
    header = "\n".join(f"{k}: {v}" for k, v in meta.items())
    print(header, flush=True)
    status = 0
    for i, dtype in enumerate(dtypes):
        timings = exhaustive_timings(dtype, ms, a.smoke, limits)
        left = a.budget_s - (time.perf_counter() - t_start)
        if i > 0 and not a.smoke and left < PLAN_DEFAULT_RUN_S[dtype] + 20:
            print(f"{dtype}: skipped ({left:.0f} s of the budget left; its default run alone "
                  f"takes ~{PLAN_DEFAULT_RUN_S[dtype]:.0f} s)", flush=True)  # fmt: skip
            continue
        status = max(status, _one_dtype(a, dtype, i, dtypes, ms, ems, auto_ems, timings, t_start,
                                        work, model_cfg, meta, header, on_gpu, out, MoEShape,
                                        VllmBackend, torch))  # fmt: skip
    print(f"total wall {time.perf_counter() - t_start:.1f} s", flush=True)
    return status


def _one_dtype(a, dtype, i, dtypes, ms, ems, auto_ems, timings, t_start, work, model_cfg, meta,
               header, on_gpu, out, MoEShape, VllmBackend, torch) -> int:  # fmt: skip
    """Default mode at every batch size, exhaustive at a subset, the side-by-side re-time;
    tables and JSON written after each stage. Returns the exit status (1: default failed)."""
    from cellbench.tune.vllm_source import SOURCE_ENV

    cache = tempfile.mkdtemp(prefix=f"triton-vllm-{dtype}-")
    os.environ["TRITON_CACHE_DIR"] = cache  # re-timing loads what the tuner compiled
    extra = ["--backend", "vllm", "--vllm-source", os.environ[SOURCE_ENV]]
    if on_gpu:
        extra += ["--compile-workers", str(a.compile_workers)]

    def left() -> float:
        return a.budget_s - (time.perf_counter() - t_start)

    d = th.run_mode(
        model_cfg, dtype, "default", ms, work / f"default-{dtype}",
        max(min(a.default_budget_s, left() - 15), 10), a.smoke, th.REF_DIR / SHIP[dtype],
        cache_dir=cache, extra=extra, keep_log=out / f"tuning_log_vllm_{dtype}_default.jsonl",
    )  # fmt: skip
    shipped = th.shipped_configs(SHIP[dtype])
    picks: dict[int, dict[str, dict]] = {}
    for m in ms:
        p = {}
        if str(m) in d.get("entries", {}):
            p["default"] = d["entries"][str(m)]["config"]
        if shipped:
            p["shipped"] = th.nearest(shipped, m)
        picks[m] = p
    st: dict = {"e": {}, "sbs": {}, "left_out": [], "ems": list(ems)}

    def save(stage: str) -> None:
        txt = table(dtype, ms, d, st["e"], st["sbs"], st["ems"], st["left_out"], timings)
        result = {
            "meta": {**meta, "stage_reached": stage, "exhaustive_batch_sizes": st["ems"]},
            "vllm_kernel": d.get("vllm_kernel"),
            "default": d,
            "exhaustive": st["e"],
            "exhaustive_timings_counted": {str(k): v for k, v in timings.items()},
            "walls": walls(d, st["e"], st["ems"], timings) if st["e"] else {},
            "side_by_side": {str(k): v for k, v in st["sbs"].items()},
            "not_retimed": st["left_out"],
            "picks": {str(k): v for k, v in picks.items()},
        }
        stem = out / f"tuner_vllm_kernel_{a.gpu}_{dtype}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
        stem.with_suffix(".txt").write_text(f"{header}\nstage: {stage}\n{txt}\n")
        print(txt, flush=True)

    save("default tuned")
    if "shape" not in d:
        return 1
    # what later dtypes need at least: their default run and a re-time
    later = sum(PLAN_DEFAULT_RUN_S[x] + 20 for x in dtypes[i + 1 :])
    if auto_ems:
        if a.smoke:
            st["ems"] = ms[:1]
        else:  # keep room for later dtypes only if this one's best set still fits
            room = left() - PLAN_MARGIN_S
            first = choose_exhaustive_ms(timings, ms, room)
            st["ems"] = choose_exhaustive_ms(timings, ms, room - later)
            if len(st["ems"]) < min(len(first), 2):
                st["ems"] = first
    ems = st["ems"]
    need = plan_exhaustive_s(timings, ems) + PLAN_SBS_S_PER_M * len(ems) if ems else 0.0
    if left() - PLAN_MARGIN_S - need < later:
        later = 0.0  # later dtypes will not fit anyway: this one's re-time may use it all
    if ems:
        print(f"{dtype}: exhaustive at M={_ms(ems)} (planned ~{plan_exhaustive_s(timings, ems):.0f}"
              f" s, {left():.0f} s of the budget left)", flush=True)  # fmt: skip
        e = st["e"] = th.run_mode(
            model_cfg, dtype, "exhaustive", ems, work / f"exhaustive-{dtype}",
            # a fresh Triton cache: its wall is not flattered by default mode's compiles
            # the re-time at its batch sizes follows within the budget
            max(left() - PLAN_SBS_S_PER_M * len(ems) - 3, 10), a.smoke, cache_dir=None,
            extra=extra,
            keep_log=out / f"tuning_log_vllm_{dtype}_exhaustive.jsonl",
        )  # fmt: skip
        for m in ems:
            if str(m) in e.get("entries", {}):
                picks.setdefault(m, {})["exhaustive"] = e["entries"][str(m)]["config"]
        save("exhaustive tuned")
    else:
        print(f"{dtype}: exhaustive skipped ({left():.0f} s of the budget left)", flush=True)
    be = VllmBackend(MoEShape.from_dict(d["shape"]), d["compute_dtype"],
                     "cuda" if on_gpu else "cpu")  # fmt: skip
    # the exhaustive batch sizes first: the comparison the budget was planned for
    order = [m for m in ems if m in ms] + [m for m in ms if m not in ems]
    deadline = time.perf_counter() + left() - later - 5
    st["sbs"], st["left_out"] = side_by_side(
        be,
        order,
        picks,
        on_gpu,
        max(deadline, time.perf_counter() + 1),
        a.compile_workers,
        a.builtin,
    )
    save("picks re-timed side by side" + (", vLLM and builtin" if a.builtin else ""))
    del be
    if on_gpu:
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
