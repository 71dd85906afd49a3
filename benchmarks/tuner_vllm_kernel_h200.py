#!/usr/bin/env python3
"""The tuner on vLLM's own fused-MoE Triton kernel, beside the builtin kernel (issue 23).

Shape: Qwen3-30B-A3B at TP=1 (E=128, N=768, K=2048, top-8), in bf16 and fp8 block [128,128],
over vLLM's 18 default batch sizes. vLLM is not installed on the H200 machine: its kernel and
launcher run from the Python files of vLLM's wheel (workflow/scripts/vllm-kernel-src.sh,
carried as .vllm-src/vllm-0.34.0), with the project's alignment, SiLU-and-mul, activation
quantisation and top-k sum around them (`cellbench.tuner.vllm_source`). Per dtype:

1. `cellbench.tuner --backend vllm --mode default`, seeded with vLLM's shipped H200 config
   (a fresh Triton cache that this process then shares);
2. per batch size, on the same inputs, interleaved CUDA-graph replays of: vLLM's kernel with
   default's pick and with the shipped config, and the builtin kernel with the same two
   configs (its automatic path, and its grouped path where the automatic one is the few-token
   path); whole fused calls and the two GEMMs alone; each output checked against the float64
   reference first. Ratios: default/shipped on vLLM's kernel, builtin/vLLM per config;
3. with the wall left, `--mode exhaustive` on vLLM's kernel at a subset of batch sizes
   (--exhaustive-ms; a full exhaustive sweep of vLLM's space over 18 batch sizes takes hours,
   so only these are compared, and the table says which), its picks re-timed beside default's
   and the shipped config's, vLLM and builtin, as in 2.

Wall, CPU and GPU seconds of each tuner run come from its summary. A table after each stage
(a run cut short keeps what it measured). Outputs: OUT/tuner_vllm_kernel_h200_<dtype>.json
and .txt (date, device, versions, vLLM source), the tuning logs, and the printed tables.

`--smoke` runs the same code on a tiny shape under the CPU interpreter (fp32 compute): a check
that the script runs, not a measurement.

Usage: python benchmarks/tuner_vllm_kernel_h200.py --out $OUT [--budget-s 520]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tuner_h200 as th  # noqa: E402 - the tuner runs and shipped-config helpers

SHIP = {
    "bf16": "E=128,N=768,device_name=NVIDIA_H200.json",
    "fp8": "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
}
DEFAULT_SOURCE = ROOT / ".vllm-src" / "vllm-0.34.0"
SHARE = {"bf16": 0.55, "fp8": 0.45}  # of the wall budget, when both run


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
    from cellbench.kernels.fused_moe import device_facts
    from cellbench.tuner.compilepool import CompilePool

    pool = CompilePool(workers, "builtin", be.shape.to_dict(), be.act_dtype, 0)
    pool.assume_device(*device_facts(be.device))
    for m in ms:
        pool.prefetch(m, list(picks.get(m, {}).values()))
    return pool


def side_by_side(
    be, ms, picks, on_gpu: bool, deadline: float, workers: int = 0
) -> tuple[dict, list[int]]:
    """Per batch size: every named config on vLLM's kernel and on the builtin kernel, same
    inputs, interleaved; whole calls and GEMMs alone. Returns (results, batch sizes left out
    because the deadline passed)."""
    import torch
    from cellbench import kernels
    from cellbench.tuner.search import rel_error
    from cellbench.tuner.timing import time_side_by_side

    out: dict[int, dict] = {}
    left_out = []
    pool = _builtin_pool(be, ms, picks, workers) if on_gpu else None
    try:
        for m in ms:
            _one_m(be, kernels, m, picks, on_gpu, deadline, pool, out, left_out,
                   rel_error, time_side_by_side)  # fmt: skip
            if on_gpu:
                torch.cuda.empty_cache()
    finally:
        if pool is not None:
            pool.close()
    return out, left_out


def _one_m(be, kernels, m, picks, on_gpu, deadline, pool, out, left_out, rel_error, tsbs):
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
    for gemms, key in ((False, "call"), (True, "gemms")):
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


def _get(s: dict, label: str, key: str):
    return s.get(label, {}).get(key)


def _ratio(a, b):
    return a / b if a and b else None


def table(dtype: str, ms, d: dict, e: dict, sbs: dict, ems, left_out) -> str:
    f = th.fmt
    lines = [f"== {dtype}: Qwen3-30B-A3B TP=1, vLLM's kernel (from its wheel) tuned by the tuner"]
    lines.append(
        "whole fused call, us (interleaved graph replays): vLLM kernel with default's pick (def) "
        "and vLLM's shipped config (ship); builtin kernel with the same configs; ratios"
    )
    lines.append(
        f"{'M':>5} {'def':>9} {'ship':>9} {'def/ship':>8} {'exh':>9} {'def/exh':>7} | "
        f"{'b:def':>9} {'b/v def':>7} {'b:ship':>9} {'b/v ship':>8} {'bg/v ship':>9} | "
        f"GEMMs {'b/v def':>7} {'b/v ship':>8} | {'spread':>6} | default pick"
    )
    de = d.get("entries", {})
    for m in ms:
        s = sbs.get(m, {})
        vd, vs_ = _get(s, "vllm:default", "call_us"), _get(s, "vllm:shipped", "call_us")
        ve = _get(s, "vllm:exhaustive", "call_us")
        bd, bs = _get(s, "builtin:default", "call_us"), _get(s, "builtin:shipped", "call_us")
        bgs = _get(s, "builtin-grouped:shipped", "call_us")
        gvd, gbd = _get(s, "vllm:default", "gemms_us"), _get(s, "builtin:default", "gemms_us")
        gvs, gbs = _get(s, "vllm:shipped", "gemms_us"), _get(s, "builtin:shipped", "gemms_us")
        spread = max((x.get("call_spread", 0) for k, x in s.items() if k != "ratios"), default=None)
        a = de.get(str(m))
        lines.append(
            f"{m:>5} {f(vd):>9} {f(vs_):>9} {f(_ratio(vd, vs_), 3):>8} {f(ve):>9} "
            f"{f(_ratio(vd, ve), 3):>7} | {f(bd):>9} {f(_ratio(bd, vd), 3):>7} {f(bs):>9} "
            f"{f(_ratio(bs, vs_), 3):>8} {f(_ratio(bgs, vs_), 3):>9} | "
            f"{f(_ratio(gbd, gvd), 3):>13} {f(_ratio(gbs, gvs), 3):>8} | {f(spread, 3):>6} | "
            f"{a['config_name'] if a else '-'}"
        )
    lines.append(th._cost_line("default", d))
    if e:
        lines.append(th._cost_line("exhaustive", e))
        lines.append(f"exhaustive ran at M={','.join(map(str, ems))} only (a subset: see --help)")
        de_w = sum(de[str(m)]["tune_wall_s"] for m in ems if str(m) in de)
        ee = e.get("entries", {})
        ex_w = sum(ee[str(m)]["tune_wall_s"] for m in ems if str(m) in ee)
        if de_w and ex_w:
            lines.append(f"tuning wall at those M: default {de_w:.1f} s / exhaustive {ex_w:.1f} s "
                         f"= {de_w / ex_w:.3f}")  # fmt: skip
    if left_out:
        lines.append(f"not re-timed (wall budget spent): M={','.join(map(str, left_out))}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape under the CPU interpreter")
    ap.add_argument(
        "--dtypes",
        default=None,
        help="comma list of bf16, fp8 (default both; smoke: bf16, since under the interpreter "
        "fp8 outputs miss the fp8 error bound and Triton 3.9 rejects vLLM's scalar-scale branch)",
    )
    ap.add_argument("--batch-sizes", default=None, help="default: vLLM's 18 (smoke: 1,8)")
    ap.add_argument(
        "--exhaustive-ms", default=None, help="default 1,16 (smoke: 1); '' to skip exhaustive"
    )
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall budget of the script")
    ap.add_argument("--default-budget-s", type=float, default=120.0, help="per dtype")
    ap.add_argument("--exhaustive-budget-s", type=float, default=90.0, help="per dtype")
    ap.add_argument(
        "--compile-workers",
        type=int,
        default=12,
        help="on a GPU: the tuner's (each runs vLLM's kernel once per candidate, on the GPU) "
        "and the side-by-side stage's (compile-only, builtin kernel)",
    )
    ap.add_argument("--vllm-source", default=os.environ.get("CELLBENCH_VLLM_SOURCE")
                    or str(DEFAULT_SOURCE), help="folder of vLLM's sources")  # fmt: skip
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/tmp")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes = [x for x in (a.dtypes or ("bf16" if a.smoke else "bf16,fp8")).split(",") if x]
    if not dtypes or any(x not in SHIP for x in dtypes):
        print(f"--dtypes={a.dtypes!r}: expected a comma list of bf16, fp8", file=sys.stderr)
        return 2
    default_ms = "1,8" if a.smoke else ",".join(map(str, th.VLLM_DEFAULT))
    ms = [int(x) for x in (a.batch_sizes or default_ms).split(",")]
    ems_text = a.exhaustive_ms if a.exhaustive_ms is not None else ("1" if a.smoke else "1,16")
    ems = [int(x) for x in ems_text.split(",") if x.strip()]
    if a.smoke:  # the interpreter must be chosen before triton decorates any kernel
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from cellbench.tuner.vllm_source import SOURCE_ENV, check_source_dir

    bad = check_source_dir(a.vllm_source)
    if bad is not None:
        print(f"--vllm-source: {bad}", file=sys.stderr)
        return 2
    os.environ[SOURCE_ENV] = str(Path(a.vllm_source).resolve())
    import torch
    import triton
    from cellbench.shapes import MoEShape
    from cellbench.tuner.backends import VllmBackend

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not a.smoke:
        print("no GPU: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    meta_src = {}
    rec = Path(a.vllm_source) / "SOURCE.json"
    if rec.is_file():
        meta_src = json.loads(rec.read_text())
    work = Path(tempfile.mkdtemp(prefix="tuner-vllm-bench-"))
    model_cfg = work / "config.json"
    model_cfg.write_text(json.dumps(th.TINY if a.smoke else th.QWEN3_30B))
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if on_gpu else "CPU (interpreter smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "vllm_source": meta_src or a.vllm_source,
        "smoke": a.smoke,
        "batch_sizes": ms,
        "exhaustive_batch_sizes": ems,
        "budget_s": a.budget_s,
        "compile_workers": a.compile_workers if on_gpu else 0,
    }
    header = "\n".join(f"{k}: {v}" for k, v in meta.items())
    print(header, flush=True)
    status = 0
    for i, dtype in enumerate(dtypes):
        # bf16's space is three times fp8's block-quantised one: it gets the larger share
        left_all = a.budget_s - (time.perf_counter() - t_start)
        share = left_all * SHARE[dtype] / sum(SHARE[x] for x in dtypes[i:])
        t_dtype = time.perf_counter()
        cache = tempfile.mkdtemp(prefix=f"triton-vllm-{dtype}-")
        os.environ["TRITON_CACHE_DIR"] = cache  # re-timing loads what the tuner compiled
        extra = ["--backend", "vllm", "--vllm-source", os.environ[SOURCE_ENV]]
        if on_gpu:
            extra += ["--compile-workers", str(a.compile_workers)]
        seed_file = th.REF_DIR / SHIP[dtype]
        d = th.run_mode(
            model_cfg, dtype, "default", ms, work / f"default-{dtype}",
            min(a.default_budget_s, share * 0.45), a.smoke, seed_file, cache_dir=cache,
            extra=extra, keep_log=out / f"tuning_log_vllm_{dtype}_default.jsonl",
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
        st: dict = {"e": {}, "sbs": {}, "left_out": []}  # what this dtype measured so far
        be = None
        if "shape" in d:
            be = VllmBackend(MoEShape.from_dict(d["shape"]), d["compute_dtype"],
                             "cuda" if on_gpu else "cpu")  # fmt: skip

        def save(stage: str, dtype=dtype, d=d, picks=picks, st=st) -> None:
            e, sbs, left_out = st["e"], st["sbs"], st["left_out"]
            txt = table(dtype, ms, d, e, sbs, ems, left_out)
            result = {
                "meta": {**meta, "stage_reached": stage},
                "vllm_kernel": d.get("vllm_kernel"),
                "default": d,
                "exhaustive": e,
                "side_by_side": {str(k): v for k, v in sbs.items()},
                "not_retimed": left_out,
                "picks": {str(k): v for k, v in picks.items()},
            }
            stem = out / f"tuner_vllm_kernel_h200_{dtype}"
            stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
            stem.with_suffix(".txt").write_text(f"{header}\nstage: {stage}\n{txt}\n")
            print(txt, flush=True)

        save("default tuned")
        if be is None:
            status = 1
            continue
        # leave room for exhaustive mode in this dtype's share
        sbs_deadline = t_dtype + share - min(a.exhaustive_budget_s, share * 0.3) - 10
        st["sbs"], st["left_out"] = side_by_side(
            be, ms, picks, on_gpu, sbs_deadline, a.compile_workers
        )
        save("default vs shipped re-timed, vLLM and builtin")
        left = share - (time.perf_counter() - t_dtype)
        if ems and left > 40:
            e = st["e"] = th.run_mode(
                model_cfg, dtype, "exhaustive", ems, work / f"exhaustive-{dtype}",
                # a fresh Triton cache: its wall is not flattered by default mode's compiles
                min(a.exhaustive_budget_s, left - 30), a.smoke, cache_dir=None, extra=extra,
                keep_log=out / f"tuning_log_vllm_{dtype}_exhaustive.jsonl",
            )  # fmt: skip
            eps = {}
            for m in ems:
                if str(m) in e.get("entries", {}):
                    eps[m] = {**picks.get(m, {}), "exhaustive": e["entries"][str(m)]["config"]}
                    picks.setdefault(m, {})["exhaustive"] = eps[m]["exhaustive"]
            if eps:
                again, _ = side_by_side(be, list(eps), eps, on_gpu, float("inf"), a.compile_workers)
                st["sbs"].update(again)
            save("exhaustive compared")
        else:
            print(f"{dtype}: exhaustive skipped ({left:.0f} s left of this dtype's share)")
        del be
        if on_gpu:
            torch.cuda.empty_cache()
    print(f"total wall {time.perf_counter() - t_start:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
