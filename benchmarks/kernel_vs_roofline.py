"""Builtin fused-MoE kernel on one GPU: ceilings, correctness, and times against the roofline.

Shape: Qwen3-30B-A3B at TP=1 (E=128, N=768, K=2048, top-8), bf16 and fp8_w8a8 block [128,128],
with the launch configs vLLM ships for the H200 (tests/data/vllm-configs/). For each M it
times the two GEMMs alone (`run_gemms`: the grouped GEMMs, or at M <= 4 on CUDA the
few-token path's one launch, which includes the activation) and the whole fused call
(`run_fused`), each
as a CUDA graph of CALLS calls rotating over ROT input sets (same weights), warm-up first,
median over replays. Roofline: bytes = expert weights the routing touches (+ scales) plus
tokens in and out; FLOPs = 2 * M * topk * (2N*K + N*K); floor = max(bytes / read bandwidth,
FLOPs / matmul rate), both measured here first. Fraction = floor / measured time.

Usage (from the repository root, on a GPU machine):
    PYTHONPATH=workflow python3 benchmarks/kernel_vs_roofline.py [--out FILE] [--ms 1,16,...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from cellbench.tune.kernels import make_problem, run_fused, run_gemms  # noqa: E402
from cellbench.tune.kernels.reference import (  # noqa: E402
    problem_error_bound,
    relative_error,
    torch_moe_reference,
)
from cellbench.tune.shapes import MoEShape, device_name  # noqa: E402
from gpu_ceilings import (  # noqa: E402
    REPLAYS,
    ceilings,
    graph_time_us,
    roofline,
    stream_ceiling,
)

CONFIG_DIR = ROOT / "tests" / "data" / "vllm-configs"
ROT = 4  # input sets rotated through inside one graph
CALLS = 8  # calls captured per graph


def nearest_config(table: dict[str, dict], m: int) -> dict:
    """vLLM's rule: the entry whose batch-size key is nearest to M."""
    key = min(table, key=lambda k: abs(int(k) - m))
    return table[key]


def input_sets(shape: MoEShape, m: int, base) -> tuple[list, list]:
    """ROT problems at M=m sharing base's weights, and the CALLS-long sequence a graph runs."""
    probs = [make_problem(shape, m, "bf16", "cuda", seed=100 * m + r, weights_from=base)
             for r in range(ROT)]  # fmt: skip
    return probs, [probs[i % ROT] for i in range(CALLS)]


def bench_dtype(label: str, shape: MoEShape, table: dict, ms: list[int], ceil: dict) -> list[dict]:
    fp8 = shape.dtype is not None
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    rows = []
    for m in ms:
        cfg = nearest_config(table, m)
        probs, seq = input_sets(shape, m, base)
        # Correctness first, on the first input set.
        out = torch.full_like(probs[0].hidden_states, float("nan"))
        run_fused(probs[0], cfg, out=out)
        torch.cuda.synchronize()
        err = relative_error(out, torch_moe_reference(probs[0]))
        ok = bool(torch.isfinite(out).all()) and err < problem_error_bound(probs[0])
        t_g = graph_time_us([lambda p=p, c=cfg: run_gemms(p, c) for p in seq])
        t_f = graph_time_us([lambda p=p, c=cfg: run_fused(p, c) for p in seq])
        rf = roofline(shape, probs, ceil, fp8)
        row = {"dtype": label, "M": m, "config": cfg, "rel_err": err, "ok": ok,
               "gemms_us": t_g, "fused_us": t_f, "fused_over_gemms": t_f / t_g,
               "roof_gemms": rf["floor_us"] / t_g, "roof_fused": rf["floor_us"] / t_f,
               "flop_frac_gemms": rf["t_flop_us"] / t_g, **rf}  # fmt: skip
        rows.append(row)
        print(f"  {label:9s} M={m:5d} gemms {t_g:8.1f} us  fused {t_f:8.1f} us  "
              f"x{t_f / t_g:4.2f}  roof(gemms) {row['roof_gemms']:5.1%}  "
              f"flops(gemms) {row['flop_frac_gemms']:5.1%}  err {err:.2e} {'ok' if ok else 'FAIL'}",
              flush=True)  # fmt: skip
        del probs, seq
        torch.cuda.empty_cache()
    del base
    torch.cuda.empty_cache()
    return rows


def _cfg(bm: int, bn: int, bk: int, gm: int, w: int, st: int) -> dict:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm,
            "num_warps": w, "num_stages": st}  # fmt: skip


# A few configs around the shipped ones at M=4096 (run 1 of 2026-12-02 also tried 12 configs at
# M=1 and the 11 listed first here at M=4096; none beat the shipped config by more than 1%).
SWEEP = {
    # M=1: more programs (smaller BLOCK_SIZE_N) and deeper pipelines than the shipped config
    ("bf16", 1): [_cfg(16, n, k, 1, w, st) for n in (16, 32, 64) for k in (64, 128, 256)
                  for w, st in ((4, 3), (4, 5), (2, 4))],
    ("bf16", 4096): [_cfg(128, n, 64, g, 8, st) for n in (128, 256) for g in (1, 16)
                     for st in (3, 4)]
    + [_cfg(64, 256, 64, 16, 8, 4), _cfg(128, 128, 128, 16, 8, 3), _cfg(256, 128, 64, 16, 8, 3),
       _cfg(128, 128, 64, 16, 4, 4), _cfg(128, 256, 64, 32, 8, 4), _cfg(128, 256, 64, 64, 8, 4),
       _cfg(64, 128, 64, 16, 4, 4)],
}  # fmt: skip


def sweep(label: str, shape: MoEShape, ms: list[int]) -> list[dict]:
    """Time the two GEMMs over SWEEP's configs; report the best per M."""
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    best = []
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        res = []
        for cfg in SWEEP.get((label, m), []):
            if shape.block_shape and shape.block_shape[1] % cfg["BLOCK_SIZE_K"]:
                continue
            try:
                t = graph_time_us([lambda p=p, c=cfg: run_gemms(p, c) for p in seq])
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: skip that config
                print(f"  sweep {label} M={m} {cfg}: {type(e).__name__}")
                continue
            res.append((t, cfg))
        if res:
            t, cfg = min(res, key=lambda x: x[0])
            print(f"  sweep {label} M={m}: best of {len(res)} {t:.1f} us {cfg}", flush=True)
            best.append({"dtype": label, "M": m, "gemms_us": t, "config": cfg})
    return best


def side_by_side(probs, seq, ref, entries, rounds: int = 3) -> tuple[dict, dict]:
    """Rounds of A B C.. / ..C B A graph timings of the two GEMMs and of the whole call.
    entries: (name, setup, config, path); setup() puts the module settings of that variant in
    place, path is the kernel path (`run_fused`'s). Returns medians {name: {"gemms",
    "fused"}}, and the samples and the relative errors of the first round's whole call
    against `ref`."""
    times = {e[0]: {"gemms": [], "fused": []} for e in entries}
    errs = {}
    for r in range(rounds):
        for name, setup, cfg, path in entries if r % 2 == 0 else entries[::-1]:
            setup()
            if r == 0:
                errs[name] = relative_error(run_fused(probs[0], cfg, path=path), ref)
            t = times[name]
            t["gemms"].append(graph_time_us(
                [lambda p=p, c=cfg, a=path: run_gemms(p, c, path=a) for p in seq]))  # fmt: skip
            t["fused"].append(graph_time_us(
                [lambda p=p, c=cfg, a=path: run_fused(p, c, path=a) for p in seq]))  # fmt: skip
    us = {k: {kk: statistics.median(vv) for kk, vv in v.items()} for k, v in times.items()}
    return us, {"samples": times, "rel_err": errs}


def _set_b_tma(value: bool | None) -> None:
    sys.modules["cellbench.tune.kernels.launch_policy"].B_OPERAND_TMA = value


def _variants_for(fp8: bool, m: int) -> list[tuple[str, str, bool | None]]:
    """(name, path, weight tiles through TMA) of the kernel variants compared at M."""
    out = [("grouped-ptr", "grouped", False), ("grouped-tma", "grouped", True)]
    if not fp8 and m <= 8:
        out.append(("decode", "decode", None))
    return out


def variants(label: str, shape: MoEShape, table: dict, ms: list[int], rounds: int = 3) -> list:
    """Kernel variants side by side with the shipped config: rounds of A B C / C B A graph
    timings, median per variant (two GEMMs, and the whole call)."""
    fp8 = shape.dtype is not None
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    out = []
    for m in ms:
        cfg = nearest_config(table, m)
        probs, seq = input_sets(shape, m, base)
        ref = torch_moe_reference(probs[0])
        entries = [(name, lambda t=tma: _set_b_tma(t), cfg, path)
                   for name, path, tma in _variants_for(fp8, m)]  # fmt: skip
        us, extra = side_by_side(probs, seq, ref, entries, rounds)
        _set_b_tma(None)
        row = {"dtype": label, "M": m, "config": cfg, "us": us, **extra}
        out.append(row)
        print(f"  variants {label} M={m}: " + "  ".join(
            f"{k} gemms {v['gemms']:.1f} fused {v['fused']:.1f} err {extra['rel_err'][k]:.1e}"
            for k, v in us.items()), flush=True)  # fmt: skip
        del probs, seq
        torch.cuda.empty_cache()
    return out


def _set_decode_kernel(name: str) -> None:
    sys.modules["cellbench.tune.kernels.launch_policy"].DECODE_KERNEL = name


def decode_sweep(shape: MoEShape, ms: list[int], kernel: str) -> list[dict]:
    """Few-token path, one of its kernels: launch parameters at small M (BLOCK_SIZE_M and
    GROUP_SIZE_M unused)."""
    _set_decode_kernel(kernel)
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    best = []
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        res = []
        # BLOCK_SIZE_N 16 and 32 give the slice kernel the same 16-column slices: keep one.
        # The ticket kernel: the region its best configs came from in run 10 (full sweep).
        for bn in (64, 128) if kernel == "ticket" else (32, 64, 128):
            for bk in (64, 128, 256) if kernel == "slice" else (128, 256):
                for w in (4, 8):
                    for st in (3, 5):
                        cfg = _cfg(16, bn, bk, 1, w, st)
                        try:
                            t = graph_time_us(
                                [lambda p=p, c=cfg: run_gemms(p, c, path="decode") for p in seq]
                            )
                        except Exception as e:  # noqa: BLE001 - e.g. out of registers
                            print(f"  decode sweep {kernel} M={m} {cfg}: {type(e).__name__}")
                            continue
                        res.append((t, cfg))
        res.sort(key=lambda x: x[0])
        for t, cfg in res[:5]:
            print(f"  decode sweep {kernel} M={m}: {t:.1f} us {cfg}", flush=True)
        best.append({"M": m, "kernel": kernel, "tried": len(res),
                     "top": [{"gemms_us": t, "config": c} for t, c in res[:10]]})  # fmt: skip
    _set_decode_kernel(DECODE_KERNEL_DEFAULT)
    return best


def tma_sweep(label: str, shape: MoEShape, ms: list[int]) -> list[dict]:
    """SWEEP's configs with weight tiles through pointers and through TMA, interleaved."""
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    out = []
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        for cfg in SWEEP.get(("bf16", m), []):
            if shape.block_shape and shape.block_shape[1] % cfg["BLOCK_SIZE_K"]:
                continue
            row = {"dtype": label, "M": m, "config": cfg}
            for tma in (False, True):
                _set_b_tma(tma)
                try:
                    row["tma" if tma else "ptr"] = graph_time_us(
                        [lambda p=p, c=cfg: run_gemms(p, c) for p in seq])  # fmt: skip
                except Exception as e:  # noqa: BLE001 - out of shared memory etc.
                    row["tma" if tma else "ptr"] = None
                    print(f"  tma sweep {label} M={m} tma={tma} {cfg}: {type(e).__name__}")
            _set_b_tma(None)
            out.append(row)
            print(f"  tma sweep {label} M={m} ptr {row['ptr']} tma {row['tma']} {cfg}",
                  flush=True)  # fmt: skip
    return out


def _set_chain(value: bool | None) -> None:
    sys.modules["cellbench.tune.kernels.launch_policy"].CHAIN_KERNELS = value


# Two variants tried and dropped (NOTES-kernel.md): GEMM 2 asking L2 for all its weight rows
# before waiting (run 5, commit b64ee0c: 27.3 vs 23.9 us at M=1), and GEMM 2 loading its
# first weight tile before waiting (run 7, commit 7e1caf9: no gain, more shared memory).
CHAIN_VARIANTS = [("unchained", False), ("chained", True)]


DECODE_KERNEL_DEFAULT = sys.modules["cellbench.tune.kernels.launch_policy"].DECODE_KERNEL
DECODE_KERNELS = ("slice", "ticket")


def decode_vs_grouped(
    shape: MoEShape,
    table: dict,
    ms: list[int],
    ceil: dict,
    kernels: tuple[str, ...] = DECODE_KERNELS,
    rounds: int = 5,
) -> list[dict]:
    """The few-token path's kernels, each with the best config of its sweep (and the first
    with the shipped config), against the grouped path with the shipped config (chained where
    the rule chains), side by side: rounds of A B C.. / ..C B A graph timings of the two
    GEMMs and of the whole call; medians and roofline fractions."""
    swept = {(r["kernel"], r["M"]): r for kn in kernels for r in decode_sweep(shape, ms, kn)}
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    out = []
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        ref = torch_moe_reference(probs[0])
        floor = roofline(shape, probs, ceil, False)["floor_us"]
        shipped = nearest_config(table, m)
        # (name, path, few-token kernel, config)
        paths = [(f"decode-{kn}", "decode", kn, swept[kn, m]["top"][0]["config"])
                 for kn in kernels if swept[kn, m]["top"]]  # fmt: skip
        paths += [("grouped", "grouped", DECODE_KERNEL_DEFAULT, shipped),
                  (f"decode-{kernels[0]}-shipped", "decode", kernels[0], shipped)]  # fmt: skip
        entries = [(name, lambda k=kn: _set_decode_kernel(k), cfg, path)
                   for name, path, kn, cfg in paths]  # fmt: skip
        us, extra = side_by_side(probs, seq, ref, entries, rounds)
        _set_decode_kernel(DECODE_KERNEL_DEFAULT)
        errs = extra["rel_err"]
        row = {"M": m, "floor_us": floor, "configs": {n: c for n, _, _, c in paths}, "us": us,
               "roof_gemms": {k: floor / v["gemms"] for k, v in us.items()}, **extra,
               "sweep": {kn: swept[kn, m] for kn in kernels}}  # fmt: skip
        out.append(row)
        print(f"  decode vs grouped M={m} (floor {floor:.1f} us): " + "  ".join(
            f"{k} gemms {v['gemms']:.1f} ({floor / v['gemms']:.1%}) fused {v['fused']:.1f} "
            f"err {errs[k]:.1e}" for k, v in us.items()), flush=True)  # fmt: skip
        del probs, seq
        torch.cuda.empty_cache()
    return out


def chain_variants(label: str, shape: MoEShape, table: dict, ms: list[int], rounds: int = 3):
    """Kernel chaining (programmatic dependent launch) on and off, side by side, with the
    shipped config and, where it is at most 64, with BLOCK_SIZE_N doubled (exhaustive's pick
    at M=1)."""
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    out = []
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        ref = torch_moe_reference(probs[0])
        shipped = nearest_config(table, m)
        cfgs = [("shipped", shipped)]
        if shipped["BLOCK_SIZE_N"] <= 64:  # wider tiles than 128 can overflow shared memory
            cfgs.append(("bn_x2", dict(shipped, BLOCK_SIZE_N=2 * shipped["BLOCK_SIZE_N"])))
        for cname, cfg in cfgs:
            entries = [(name, lambda on=on: _set_chain(on), cfg, "auto")
                       for name, on in CHAIN_VARIANTS]  # fmt: skip
            us, extra = side_by_side(probs, seq, ref, entries, rounds)
            _set_chain(None)
            row = {"dtype": label, "M": m, "config_name": cname, "config": cfg, "us": us, **extra}
            out.append(row)
            print(f"  chain {label} M={m} {cname}: " + "  ".join(
                f"{k} gemms {v['gemms']:.1f} fused {v['fused']:.1f} err {extra['rel_err'][k]:.1e}"
                for k, v in us.items()), flush=True)  # fmt: skip
        del probs, seq
        torch.cuda.empty_cache()
    return out


# (name, GEMMs that run persistent, flatten the tile loop)
PERSISTENT_VARIANTS = [
    ("one-tile", (), True),
    ("p2-flat", (2,), True),
    ("p2-nested", (2,), False),
    ("p12-flat", (1, 2), True),
    ("p12-nested", (1, 2), False),
]
# Configs tried with each variant beyond the shipped one: the tuner's pick at M>=1024 (run 15)
# and the same tile with one stage less (a persistent program's pipeline spans two tiles).
PERSISTENT_EXTRA_CONFIGS = [_cfg(128, 256, 64, 16, 8, 4), _cfg(128, 256, 64, 16, 8, 3)]


_PERSISTENT_NAMES = ("PERSISTENT_GEMMS", "PERSISTENT_FLATTEN", "PERSISTENT_MIN_PAIRS",
                     "PERSISTENT_QUANTISED")  # fmt: skip


def _persistent_settings() -> tuple:
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    return tuple(getattr(policy, n) for n in _PERSISTENT_NAMES)


def _restore_persistent(saved: tuple) -> None:
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    for n, v in zip(_PERSISTENT_NAMES, saved, strict=True):
        setattr(policy, n, v)


def _set_persistent(gemms: tuple[int, ...], flatten: bool) -> None:
    """One variant at every pair count and dtype (the module's rule has limits on both)."""
    _restore_persistent((gemms, flatten, 1, True))


def persistent_variants(label: str, shape: MoEShape, table: dict, ms: list[int], ceil: dict,
                        rounds: int = 3) -> list[dict]:  # fmt: skip
    """Persistent grouped GEMMs (one program per SM looping over the tiles; GEMM 2 alone or
    both; tile loop flattened into the pipeline or not) against one tile per program, side by
    side, with the shipped config and PERSISTENT_EXTRA_CONFIGS. Unchained (chaining is for
    small calls and excludes persistence)."""
    fp8 = shape.dtype is not None
    base = make_problem(shape, 1, "bf16", "cuda", seed=1)
    out = []
    saved = _persistent_settings()  # the module's rule, restored at the end
    _set_chain(False)
    for m in ms:
        probs, seq = input_sets(shape, m, base)
        ref = torch_moe_reference(probs[0])
        roof = roofline(shape, probs, ceil, fp8)
        shipped = nearest_config(table, m)
        cfgs = [("shipped", shipped)] + [
            (f"c{i}", c) for i, c in enumerate(PERSISTENT_EXTRA_CONFIGS) if c != shipped
        ]
        for cname, cfg in cfgs:
            entries = []
            for name, g, f in PERSISTENT_VARIANTS:  # a variant that fails drops out alone
                _set_persistent(g, f)
                try:
                    run_fused(probs[0], cfg)
                    run_gemms(probs[0], cfg)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                    print(f"  persistent {label} M={m} {cname} {name}: {type(e).__name__}: "
                          f"{e}"[:400])  # fmt: skip
                    continue
                finally:
                    _restore_persistent(saved)
                entries.append((name, lambda g=g, f=f: _set_persistent(g, f), cfg, "auto"))
            if len(entries) < 2:
                continue
            try:
                us, extra = side_by_side(probs, seq, ref, entries, rounds)
            finally:
                _restore_persistent(saved)
            row = {"dtype": label, "M": m, "config_name": cname, "config": cfg, "us": us,
                   "matmul_frac_gemms": {k: roof["t_flop_us"] / v["gemms"]
                                         for k, v in us.items()}, **extra}  # fmt: skip
            out.append(row)
            print(f"  persistent {label} M={m} {cname} {cfg}: " + "  ".join(
                f"{k} gemms {v['gemms']:.1f} ({row['matmul_frac_gemms'][k]:.1%}) fused "
                f"{v['fused']:.1f} err {extra['rel_err'][k]:.1e}"
                for k, v in us.items()), flush=True)  # fmt: skip
        del probs, seq
        torch.cuda.empty_cache()
    _set_chain(None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", default="1,16,64,256,1024,4096")
    ap.add_argument("--dtypes", default="bf16,fp8_block")
    ap.add_argument("--json", help="also write all rows as JSON here")
    ap.add_argument("--sweep", action="store_true", help="also try SWEEP's configs")
    ap.add_argument("--variants", action="store_true",
                    help="also compare kernel variants (pointer/TMA weight tiles, few-token "
                         "path) side by side, sweep the few-token path at M<=4 and TMA at "
                         "SWEEP's batch sizes")  # fmt: skip
    ap.add_argument(
        "--chain-ms", default="", help="batch sizes at which to compare kernel chaining on and off"
    )
    ap.add_argument("--stream", action="store_true",
                    help="measure what a plain Triton read of M=1's 75.5 MB reaches (one "
                         "launch by grid size; two launches, chained and not)")  # fmt: skip
    ap.add_argument("--decode-ms", default="",
                    help="batch sizes at which to sweep the few-token path and time its best "
                         "config against the grouped path (bf16)")  # fmt: skip
    ap.add_argument("--decode-kernels", default=",".join(DECODE_KERNELS),
                    help="few-token kernels to sweep and compare at --decode-ms")  # fmt: skip
    ap.add_argument("--persistent-ms", default="",
                    help="batch sizes at which to compare persistent grouped GEMMs with one "
                         "tile per program")  # fmt: skip
    ap.add_argument("--skip-main", action="store_true", help="only the optional parts")
    args = ap.parse_args()
    ms = [int(x) for x in args.ms.split(",")]
    dev = device_name()
    print(f"# kernel_h200 {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}")
    print(f"# device {dev} ({torch.cuda.get_device_name(0)}), torch {torch.__version__}, "
          f"triton {triton.__version__}, python {platform.python_version()}, "
          f"CUDA {torch.version.cuda}")  # fmt: skip
    ceil = ceilings()
    print(f"# ceilings: copy {ceil['copy_GBps']:.0f} GB/s (read+write), read "
          f"{ceil['read_GBps']:.0f} GB/s (a 75.5 MB read: {ceil['read_75MB_GBps']:.0f} GB/s), "
          f"bf16 matmul "
          f"{ceil['bf16_TFLOPs']:.0f} TFLOP/s, fp8 matmul "
          f"{ceil['fp8_TFLOPs']:.0f} TFLOP/s")  # fmt: skip
    print(f"# graphs of {CALLS} calls over {ROT} input sets, median of {REPLAYS} replays")
    rows: list[dict] = []
    sweeps: list[dict] = []
    var_rows: list[dict] = []
    dec_rows: list[dict] = []
    tma_rows: list[dict] = []
    chain_rows: list[dict] = []
    stream_rows: list[dict] = stream_ceiling() if args.stream else []
    chain_ms = [int(x) for x in args.chain_ms.split(",") if x]
    decode_ms = [int(x) for x in args.decode_ms.split(",") if x]
    dvg_rows: list[dict] = []
    persistent_ms = [int(x) for x in args.persistent_ms.split(",") if x]
    pers_rows: list[dict] = []
    for label in args.dtypes.split(","):
        if label == "bf16":
            shape = MoEShape(128, 768, 2048, 8)
        elif label == "fp8_block":
            shape = MoEShape(128, 768, 2048, 8, "fp8_w8a8", (128, 128))
        else:
            raise SystemExit(f"unknown dtype label {label!r} (bf16, fp8_block)")
        name = shape.config_file_name("NVIDIA_H200")
        table = json.loads((CONFIG_DIR / name).read_text())
        table.pop("triton_version", None)
        print(f"# {label}: configs from {name}")
        if decode_ms and label == "bf16":
            kernels = tuple(args.decode_kernels.split(","))
            dvg_rows += decode_vs_grouped(shape, table, decode_ms, ceil, kernels)
        if chain_ms:
            chain_rows += chain_variants(label, shape, table, chain_ms)
        if persistent_ms:
            pers_rows += persistent_variants(label, shape, table, persistent_ms, ceil)
        if not args.skip_main:
            rows += bench_dtype(label, shape, table, ms, ceil)
        if args.sweep:
            sweeps += sweep(label, shape, [m for m in ms if (label, m) in SWEEP])
        if args.variants:
            var_rows += variants(label, shape, table, ms)
            if label == "bf16":
                for kn in DECODE_KERNELS:
                    dec_rows += decode_sweep(shape, [m for m in ms if m <= 4], kn)
            tma_rows += tma_sweep(label, shape, [m for m in ms if ("bf16", m) in SWEEP])
    print(
        "\n| dtype | M | gemms us | fused us | fused/gemms | roofline (gemms) | "
        "roofline (fused) | FLOP-rate frac (gemms) | rel err |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['M']} | {r['gemms_us']:.1f} | {r['fused_us']:.1f} | "
              f"{r['fused_over_gemms']:.2f} | {r['roof_gemms']:.1%} | {r['roof_fused']:.1%} | "
              f"{r['flop_frac_gemms']:.1%} | {r['rel_err']:.2e}"
              f"{'' if r['ok'] else ' FAIL'} |")  # fmt: skip
    if args.json:
        doc = {"ceilings": ceil, "rows": rows, "sweeps": sweeps, "variants": var_rows,
               "decode_sweep": dec_rows, "tma_sweep": tma_rows, "chain": chain_rows,
               "stream": stream_rows, "decode_vs_grouped": dvg_rows,
               "persistent": pers_rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
