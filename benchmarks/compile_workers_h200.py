"""Compile workers on one GPU: workers that open the GPU against compile-only workers.

The tuner's compile pool starts `--workers` processes that warm up (compile) candidate
configs while the main process times on the GPU. Before their first compile, workers that
open the GPU each create a CUDA context, all at once on one device; compile-only workers
take the device's facts from the main process instead (`tuner/compilepool.py`). This script
times, for each kind in alternating order (A B B A ...), a fresh pool with an empty Triton
cache compiling the same `--configs` GEMM configs of the Qwen3-30B-A3B TP=1 shape (E=128,
N=768, K=2048, top-8) at batch size `--m`: when each worker was up, had imported torch and
the kernels, and was ready, and when the last config was compiled.

Then it checks the point of the exercise: the main process launches every config that a
compile-only pool compiled, with that pool's cache, and counts the Triton cache entries its
launches add (0 = each launch loaded the worker's binary; compiling would add one entry
per kernel). The config-independent kernels (alignment, activation, sums) are compiled
first by one launch of a config outside the set.

Usage (repository root, GPU machine):
    PYTHONPATH=workflow python3 benchmarks/compile_workers_h200.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

import torch  # noqa: E402
import triton  # noqa: E402
from cellbench.shapes import MoEShape  # noqa: E402
from cellbench.tuner import compilepool  # noqa: E402
from cellbench.tuner.backends import make_backend  # noqa: E402


def gemm_configs(n: int) -> list[dict[str, int]]:
    """n distinct grouped-GEMM configs (block shapes, warps, stages), all valid here."""
    out = []
    for bm, bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (64, 128), (4, 8),
                                              (3, 4)):  # fmt: skip
        out.append({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                    "GROUP_SIZE_M": 1, "num_warps": w, "num_stages": s})  # fmt: skip
    return out[:n]


def cache_entries(cache: Path) -> int:
    return sum(1 for p in cache.iterdir() if p.is_dir()) if cache.exists() else 0


def one_pool(compile_only: bool, shape: MoEShape, m: int, cfgs: list, workers: int) -> dict:
    """A fresh pool on an empty cache compiles cfgs at m; returns its timings and cache."""
    cache = Path(tempfile.mkdtemp(prefix="cb-triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the workers inherit it at spawn
    t0 = time.perf_counter()
    pool = compilepool.CompilePool(workers, "builtin", shape.to_dict(), "bf16", 0,
                                   compile_only=compile_only)  # fmt: skip
    if pool.compile_only:
        from cellbench.kernels.fused_moe import device_facts

        pool.assume_device(*device_facts("cuda:0"))
    try:
        pool.prefetch(m, cfgs)
        for c in cfgs:
            pool.wait(m, c)
        done_s = time.perf_counter() - t0
        ok = sum(1 for f in pool._futures.values() if f.result()[0])
        startup = pool.startup()
    finally:
        pool.close()
    return {"compile_only": pool.compile_only, "all_compiled_s": round(done_s, 3),
            "compiled_ok": ok, "startup": {k: round(v, 3) for k, v in startup.items()},
            "cache": str(cache), "cache_entries": cache_entries(cache)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=max((os.cpu_count() or 2) - 1, 1))
    ap.add_argument("--configs", type=int, default=30)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="A-B pairs (order alternates)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compile_workers_h200.py needs a GPU")
    torch.cuda.set_device(0)
    shape = MoEShape(num_experts=128, intermediate_size=768, hidden_size=2048, topk=8)
    cfgs = gemm_configs(a.configs)
    runs = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for compile_only in order:
            res = one_pool(compile_only, shape, a.m, cfgs, a.workers)
            res["round"] = r
            runs.append(res)
            su = {k: res["startup"].get(k, 0.0) for k in (
                "first_ready", "last_ready", "worker_started", "torch_imported",
                "kernels_imported", "ready")}  # fmt: skip
            kind = "compile-only" if compile_only else "opens GPU  "
            print(f"round {r} {kind}: {res['compiled_ok']}/{len(cfgs)} compiled, all done "
                  f"{res['all_compiled_s']:.2f} s; workers ready {su['first_ready']:.2f}-"
                  f"{su['last_ready']:.2f} s (medians: up {su['worker_started']:.2f}, torch "
                  f"{su['torch_imported']:.2f}, kernels {su['kernels_imported']:.2f}, "
                  f"ready {su['ready']:.2f})", flush=True)  # fmt: skip

    # Does the main process's launch load what a compile-only worker compiled?
    last = next(x for x in reversed(runs) if x["compile_only"])
    cache = Path(last["cache"])
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    backend = make_backend("builtin", shape, "bf16", torch.device("cuda", 0))
    prob = backend.make_problem(a.m, 0)
    outside = {**cfgs[0], "GROUP_SIZE_M": 16}  # not in the set: compiles the shared kernels
    backend.output(prob, outside)
    torch.cuda.synchronize()
    before = cache_entries(cache)
    t0 = time.perf_counter()
    for c in cfgs:
        backend.output(prob, c)
    torch.cuda.synchronize()
    launch_s = time.perf_counter() - t0
    added = cache_entries(cache) - before
    hit = {"configs": len(cfgs), "cache_entries_added": added,
           "launch_all_s": round(launch_s, 3)}  # fmt: skip
    print(
        f"main process launched {len(cfgs)} compile-only-compiled configs in {launch_s:.2f} s; "
        f"Triton cache entries added: {added} (0 = every binary was the worker's)"
    )

    def med(compile_only: bool, key: str) -> float:
        vals = [x[key] if key in x else x["startup"].get(key, 0.0) for x in runs
                if x["compile_only"] == compile_only]  # fmt: skip
        return statistics.median(vals)

    for key in ("last_ready", "all_compiled_s"):
        print(
            f"median {key}: opens GPU {med(False, key):.2f} s, compile-only {med(True, key):.2f} s"
        )
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "workers": a.workers, "m": a.m, "configs": len(cfgs), "runs": runs, "hit_check": hit,
    }  # fmt: skip
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if added == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
