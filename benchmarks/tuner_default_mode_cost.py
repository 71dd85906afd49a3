#!/usr/bin/env python3
"""Tuner benchmark: the default mode's cost and quality on one shape.

Shape: Qwen3-30B-A3B at TP=1 (E=128, N=768, K=2048, top-8), bf16 (or fp8 block [128,128]),
on the builtin kernel, over vLLM's 18 default batch sizes:

1. `cellbench.tune --mode default` seeded with the config file vLLM ships for the shape
   (fresh Triton cache; this process shares it afterwards so re-timing compiles nothing);
2. default's pick and the shipped config for each batch size re-timed side by side
   (interleaved CUDA-graph replays);
3. with the wall budget left, `--mode exhaustive` at a few batch sizes (1 and 64) in a fresh
   cache, its picks re-timed beside default's, and the per-batch-size wall ratio;
4. a table after each stage (so a run cut short still leaves what it measured): per batch
   size the pick, new kernels compiled, tuning wall, side-by-side times and ratios; totals of
   wall, CPU (compile workers included) and GPU seconds.

`--smoke` runs the same code on a tiny shape under the CPU interpreter (a typo check, not a
measurement). Outputs: OUT/tuner_<gpu>_<dtype>.json and .txt (<gpu>: --gpu, default this device's
name, e.g. h100), and the printed tables.

Usage: python benchmarks/tuner_default_mode_cost.py --out $OUT [--budget-s 270]
           [--exhaustive-ms 1,64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_label import add_gpu_argument, gpu_label  # noqa: E402

QWEN3_30B = {
    "model_type": "qwen3_moe",
    "num_experts": 128,
    "moe_intermediate_size": 768,
    "hidden_size": 2048,
    "num_experts_per_tok": 8,
}
TINY = {"num_experts": 8, "moe_intermediate_size": 32, "hidden_size": 64, "num_experts_per_tok": 2}
REF_DIR = ROOT / "tests" / "data" / "vllm-configs"
VLLM_DEFAULT = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]


def run_mode(
    model_cfg: Path,
    dtype: str,
    mode: str,
    ms: list[int],
    out: Path,
    budget: float,
    smoke: bool,
    seed_file: Path | None = None,
    cache_dir: str | None = None,
    extra: list[str] | None = None,
    keep_log: Path | None = None,
) -> dict:
    """One tuner run in a fresh process with a fresh Triton cache; returns its summary."""
    args = [
        sys.executable,
        "-m",
        "cellbench.tune",
        "--model-config",
        str(model_cfg),
        "--tp",
        "1",
        "--batch-sizes",
        ",".join(map(str, ms)),
        "--mode",
        mode,
        "--out",
        str(out),
        "--time-budget-s",
        f"{budget:.0f}",
    ]
    if dtype == "fp8":
        block = "32,32" if smoke else "128,128"  # the tiny shape cannot hold 128x128 blocks
        args += ["--dtype", "fp8_w8a8", "--block-shape", block]
    else:
        args += ["--dtype", "none"]
    if smoke:
        args += ["--device-name", "NVIDIA_H200"]
    if mode == "default" and seed_file is not None:
        args += ["--seed-configs", str(seed_file)]
    env = dict(os.environ)
    args += extra or []
    env["TRITON_CACHE_DIR"] = cache_dir or tempfile.mkdtemp(prefix=f"triton-{dtype}-{mode}-")
    env["PYTHONPATH"] = str(ROOT / "workflow") + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    rc = subprocess.run(args, env=env).returncode
    wall = time.perf_counter() - t0
    log = out / "tuning_log.jsonl"
    if log.exists() and keep_log is not None:  # every candidate with its time: the audit trail
        shutil.copyfile(log, keep_log)
    summary = out / "summary.json"
    if rc != 0 or not summary.exists():
        return {"failed": True, "rc": rc, "wall_outer_s": wall}
    s = json.loads(summary.read_text())
    s["wall_outer_s"] = wall
    return s


def run_meta(torch, triton, on_gpu: bool) -> dict:
    """What every benchmark output starts with: when, on what, with which versions."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0) if on_gpu else "CPU (interpreter smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
    }


def shipped_configs(config_file: str) -> dict[int, dict] | None:
    p = REF_DIR / config_file
    if not config_file or not p.is_file():
        return None
    d = json.loads(p.read_text())
    return {int(k): v for k, v in d.items() if k != "triton_version"}


def nearest(table: dict[int, dict], m: int) -> dict:
    return table[min(table, key=lambda k: abs(k - m))]


def side_by_side(
    shape_dict: dict, act: str, ms: list[int], picks: dict[int, dict[str, dict]], on_gpu: bool
) -> dict:
    """Re-time each batch size's candidate configs interleaved; also check them vs reference."""
    import torch
    from cellbench.tune.backends import BuiltinBackend
    from cellbench.tune.candidates import rel_error
    from cellbench.tune.shapes import MoEShape
    from cellbench.tune.timing import time_side_by_side

    dev = "cuda" if on_gpu else "cpu"
    be = BuiltinBackend(MoEShape.from_dict(shape_dict), act, dev)
    out = {}
    for m in ms:
        named = picks.get(m, {})
        if not named:
            continue
        problems = [be.make_problem(m, 1000 + i) for i in range(4 if on_gpu else 2)]
        ref = be.reference(problems[0])
        errs = {}
        for name, cfg in named.items():
            try:
                errs[name] = rel_error(be.output(problems[0], cfg), ref)
            except Exception as e:  # noqa: BLE001 - reported in the table
                errs[name] = f"{type(e).__name__}: {e}"
        ok = {n: c for n, c in named.items() if isinstance(errs[n], float)}
        for n in named:
            if n not in ok:
                print(f"M={m} {n}: cannot run {named[n]}: {errs[n]}", flush=True)
        ts = time_side_by_side(
            [[be.call(p, c) for p in problems] for c in ok.values()],
            on_gpu=on_gpu,
            repeats=30 if on_gpu else 3,
        )
        out[m] = {
            n: {
                "config": ok[n],
                "median_us": t.median_us,
                "spread": t.spread,
                "error": errs[n],
                "bound": be.error_bound,
            }
            for n, t in zip(ok, ts, strict=True)
        }
        if on_gpu:
            torch.cuda.empty_cache()
    return out


def fmt(v, nd=2):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _cost_line(name: str, s: dict) -> str:
    from cellbench.tune.outputs import worker_line

    if s.get("failed"):
        return f"{name}: FAILED (rc {s.get('rc')})"
    sec, c = s["seconds"], s["counts"]
    return (
        f"{name:>10}: wall {sec['wall']:.1f} s (process {s['wall_outer_s']:.1f} s), "
        f"cpu {sec['cpu']:.1f} s (compile workers {sec['compile_cpu']:.1f}), gpu "
        f"{sec['gpu']:.1f} s; setup {sec.get('setup', 0):.1f} s, waiting for compile "
        f"workers {sec.get('compile_wait', 0):.1f} s; "
        f"timed {c['timed']}, pruned {c['pruned']}, failed {c['failed']}; "
        f"complete={s.get('complete')} skipped={s.get('skipped_batch_sizes')}"
        + (
            f"\n{'':>12}{worker_line(w)}"
            if (w := s.get("compile_workers")) and "ready" in w
            else ""
        )
    )


def table(dtype: str, ms: list[int], d: dict, e: dict, sbs: dict, shipped_ok: bool) -> str:
    """Per batch size: default's pick and the shipped config (and exhaustive's pick where it
    ran) re-timed side by side; default's new kernels and tuning wall; then the totals."""
    lines = [f"== {dtype}: Qwen3-30B-A3B TP=1 shape, builtin kernel, default mode =="]
    lines.append(
        f"{'M':>5} {'tuned_us':>9} {'new_k':>5} {'wall_s':>6} | side-by-side: {'def':>9} "
        f"{'vllm':>9} {'def/vllm':>8} {'exh':>9} {'def/exh':>7} {'spread':>6} "
        f"{'exh_wall':>8} {'wall_ratio':>10} | default pick"
    )
    de, ee = d.get("entries", {}), e.get("entries", {})
    for m in ms:
        a, b = de.get(str(m)), ee.get(str(m))
        s = sbs.get(m, {})
        sd, sv, se = (s.get(k, {}).get("median_us") for k in ("default", "vllm", "exhaustive"))
        spread = max((x["spread"] for x in s.values()), default=None)
        wr = a["tune_wall_s"] / b["tune_wall_s"] if a and b and b.get("tune_wall_s") else None
        lines.append(
            f"{m:>5} {fmt(a and a['time_us']):>9} {fmt(a and a.get('new_compiles')):>5} "
            f"{fmt(a and a.get('tune_wall_s'), 1):>6} | {'':>13} {fmt(sd):>9} {fmt(sv):>9} "
            f"{fmt(sd / sv if sd and sv else None, 3):>8} {fmt(se):>9} "
            f"{fmt(sd / se if sd and se else None, 3):>7} {fmt(spread, 3):>6} "
            f"{fmt(b and b.get('tune_wall_s'), 1):>8} {fmt(wr, 3):>10} "
            f"| {a['config_name'] if a else '-'}"
        )
    lines.append(_cost_line("default", d))
    if e:
        lines.append(_cost_line("exhaustive", e))
        same = set(d.get("entries", {})) == set(e.get("entries", {}))
        if same and e.get("complete") and not d.get("failed"):
            dw, ew = d["seconds"]["wall"], e["seconds"]["wall"]
            lines.append(f"whole runs over the same batch sizes: default wall / exhaustive wall "
                         f"= {dw:.1f} / {ew:.1f} = {dw / ew:.3f}")  # fmt: skip
    if not shipped_ok:
        lines.append("vLLM-shipped file for this shape not found: no vllm column")
    return "\n".join(lines)


def across_runs(d: dict, ms: list[int], earlier: Path) -> str:
    """Default's wall in this run against an earlier run's exhaustive wall over the same batch
    sizes (not side by side: other machine state, and the earlier code): per batch size and
    whole. Printed, and labelled, apart from the same-run figures."""
    e = json.loads(earlier.read_text()).get("exhaustive", {})
    ee, de = e.get("entries", {}), d.get("entries", {})
    lines = [f"ACROSS RUNS: default (this run) vs exhaustive of {earlier.name}:"]
    for m in ms:
        a, b = de.get(str(m)), ee.get(str(m))
        if a and b:
            lines.append(
                f"  M={m}: {a['tune_wall_s']:.1f} / {b['tune_wall_s']:.1f} s = "
                f"{a['tune_wall_s'] / b['tune_wall_s']:.3f}; best us {a['time_us']:.2f} / "
                f"{b['time_us']:.2f} (each in its own run)"
            )
    if e.get("complete") and set(ee) == {str(m) for m in ms}:
        dw, ew = d["seconds"]["wall"], e["seconds"]["wall"]
        lines.append(f"  whole: {dw:.1f} / {ew:.1f} s = {dw / ew:.3f}")
    else:
        lines.append("  whole: not comparable (the earlier run covered other batch sizes)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape under the CPU interpreter")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--batch-sizes", default=None, help="default: vLLM's 18 (smoke: 1,2,8)")
    ap.add_argument("--exhaustive-ms", default="1,64", help="'' to skip exhaustive mode")
    ap.add_argument("--budget-s", type=float, default=270.0, help="wall budget of the script")
    ap.add_argument("--default-budget-s", type=float, default=130.0)
    ap.add_argument("--compile-budget", default=None, help="passed to the tuner (FIRST,LATER)")
    ap.add_argument(
        "--no-seed",
        action="store_true",
        help="do not seed default mode with the configs vLLM ships for the shape",
    )
    ap.add_argument(
        "--earlier-exhaustive",
        default=None,
        help="JSON of an earlier run of this script whose exhaustive mode covered these batch "
        "sizes: also print default's wall against it, labelled as a ratio across runs",
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/tmp")
    add_gpu_argument(ap)
    a = ap.parse_args()
    t_start = time.perf_counter()
    out = Path(a.out)
    gpu = gpu_label(a.gpu)
    out.mkdir(parents=True, exist_ok=True)
    default_ms = "1,2,8" if a.smoke else ",".join(map(str, VLLM_DEFAULT))
    ms = [int(x) for x in (a.batch_sizes or default_ms).split(",")]
    ems = [int(x) for x in a.exhaustive_ms.split(",") if x.strip()]
    if a.smoke:  # the interpreter must be chosen before triton decorates any kernel
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # this process re-times default's picks: share its Triton cache so nothing recompiles
    default_cache = tempfile.mkdtemp(prefix="triton-default-")
    os.environ["TRITON_CACHE_DIR"] = default_cache
    import torch
    import triton

    on_gpu = torch.cuda.is_available()
    if not on_gpu and not a.smoke:
        print("no GPU: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tuner-bench-"))
    model_cfg = work / "config.json"
    model_cfg.write_text(json.dumps(TINY if a.smoke else QWEN3_30B))
    dtype = a.dtype
    ship_name = "E=128,N=768,device_name=NVIDIA_H200.json"
    if dtype == "fp8" and not a.smoke:
        ship_name = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    seed_file = None if a.no_seed else REF_DIR / ship_name
    meta = {
        **run_meta(torch, triton, on_gpu),
        "cpus": os.cpu_count(),
        "smoke": a.smoke,
        "batch_sizes": ms,
        "exhaustive_batch_sizes": ems,
        "budget_s": a.budget_s,
        "default_seeded_with": None if seed_file is None else seed_file.name,
        "compile_budget": a.compile_budget or "tuner default",
    }
    header = "\n".join(f"{k}: {v}" for k, v in meta.items())
    print(header, flush=True)
    extra = ["--compile-budget", a.compile_budget] if a.compile_budget else []
    d = run_mode(
        model_cfg, dtype, "default", ms, work / "default", a.default_budget_s, a.smoke,
        seed_file, cache_dir=default_cache, extra=extra,
        keep_log=out / f"tuning_log_{dtype}_default.jsonl",
    )  # fmt: skip
    ref_summary = d
    shipped = None
    if not d.get("failed"):
        shipped = shipped_configs(d["config_file"].replace("CPU_TRITON_INTERPRET", "NVIDIA_H200"))
    if a.smoke and shipped is None:  # the tiny shape has no shipped file: use Qwen's
        shipped = shipped_configs("E=128,N=768,device_name=NVIDIA_H200.json")
    picks: dict[int, dict[str, dict]] = {}
    for m in ms:
        p = {}
        if str(m) in d.get("entries", {}):
            p["default"] = d["entries"][str(m)]["config"]
        if shipped:
            p["vllm"] = nearest(shipped, m)
        picks[m] = p
    e: dict = {}
    sbs: dict = {}

    def save(stage: str) -> None:
        txt = table(dtype, ms, d, e, sbs, shipped is not None)
        result = {
            "meta": {**meta, "stage_reached": stage},
            "default": d,
            "exhaustive": e,
            "side_by_side": {str(k): v for k, v in sbs.items()},
            "picks": {str(k): v for k, v in picks.items()},
        }
        (out / f"tuner_{gpu}_{dtype}.json").write_text(json.dumps(result, indent=1, default=str))
        (out / f"tuner_{gpu}_{dtype}.txt").write_text(f"{header}\nstage: {stage}\n{txt}\n")
        print(txt, flush=True)

    save("default tuned")
    if "shape" in ref_summary:
        sbs = side_by_side(ref_summary["shape"], ref_summary["compute_dtype"], ms, picks, on_gpu)
    save("default vs shipped re-timed")
    left = a.budget_s - (time.perf_counter() - t_start)
    if ems and left > 40 and "shape" in ref_summary:
        e = run_mode(
            model_cfg, dtype, "exhaustive", ems, work / "exhaustive", left - 25, a.smoke,
            keep_log=out / f"tuning_log_{dtype}_exhaustive.jsonl",
        )  # fmt: skip
        eps = {}
        for m in ems:
            if str(m) in e.get("entries", {}) and picks.get(m, {}).get("default"):
                eps[m] = {
                    "default": picks[m]["default"],
                    "exhaustive": e["entries"][str(m)]["config"],
                }
                if "vllm" in picks[m]:
                    eps[m]["vllm"] = picks[m]["vllm"]
                picks[m]["exhaustive"] = eps[m]["exhaustive"]
        if eps:
            again = side_by_side(
                ref_summary["shape"], ref_summary["compute_dtype"], list(eps), eps, on_gpu
            )
            sbs.update(again)
        save("exhaustive compared")
    else:
        print(f"exhaustive skipped ({left:.0f} s left)", flush=True)
    if a.earlier_exhaustive and not d.get("failed"):
        txt = across_runs(d, ms, Path(a.earlier_exhaustive))
        print(txt, flush=True)
        with open(out / f"tuner_{gpu}_{dtype}.txt", "a", encoding="utf-8") as f:
            f.write(txt + "\n")
    spreads = [x["spread"] for s in sbs.values() for x in s.values()]
    if spreads:
        print(f"median side-by-side spread: {statistics.median(spreads):.4f}", flush=True)
    print(f"total wall {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
