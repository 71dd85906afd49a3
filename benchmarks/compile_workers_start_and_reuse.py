"""Compile workers on one GPU: three ways to start them, and whether their binaries are used.

The tuner's compile pool starts `--workers` processes that warm up (compile) candidate
configs while the main process times on the GPU. Workers that open the GPU each create a
CUDA context, all at once on one device, before their first compile; compile-only workers
take the device's facts from the main process instead (`tuner/compilepool.py`), and can
then be forked from it (inheriting torch, triton and the kernels, already imported) rather
than spawned (importing them again). This script times, for each kind in rotating order,
a fresh pool on an empty Triton cache compiling the same `--configs` GEMM configs of the
Qwen3-30B-A3B TP=1 shape (E=128, N=768, K=2048, top-8) at batch size `--m`: when each
worker was up, had imported torch and the kernels, and was ready, and when the last config
was compiled.

A fourth kind also compiles the batch size's config-independent kernels (alignment per
BLOCK_SIZE_M, activation, sums) in the workers (`compilepool.SHARED_WARMUPS`).

Then it checks the point of the exercise: the main process launches every config that the
last pool of that fourth kind compiled, with that pool's cache, and counts the Triton cache
entries its launches add (0 = every kernel it launched, config-independent ones included,
was the workers'; compiling would add one entry per kernel).

Usage (repository root, GPU machine):
    PYTHONPATH=workflow python3 benchmarks/compile_workers_start_and_reuse.py [--out FILE.json]
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
from cellbench.tune import compilepool  # noqa: E402
from cellbench.tune.backends import make_backend  # noqa: E402
from cellbench.tune.shapes import MoEShape  # noqa: E402


def gemm_configs(n: int) -> list[dict[str, int]]:
    """n distinct grouped-GEMM configs (block shapes, warps, stages), all valid here."""
    out = []
    for bm, bn, bk, w, s in itertools.product((16, 32, 64), (64, 128, 256), (64, 128), (4, 8),
                                              (3, 4)):  # fmt: skip
        out.append({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk,
                    "GROUP_SIZE_M": 1, "num_warps": w, "num_stages": s})  # fmt: skip
    return out[:n]


def cache_entries(cache: Path) -> int:
    """Compiled kernels in a Triton cache (their metadata files; launcher modules, which the
    main process builds on first launch whoever compiled the kernel, have none)."""
    return sum(1 for p in cache.rglob("*.json") if not p.name.startswith("__grp__"))


KINDS = {  # name: (compile_only, forked, shared kernels too: compilepool.SHARED_WARMUPS)
    "opens GPU": (False, False, False),
    "compile-only spawned": (True, False, False),
    "compile-only forked": (True, True, False),
    "forked + shared": (True, True, True),
}


def one_pool(kind: str, shape: MoEShape, m: int, cfgs: list, workers: int) -> dict:
    """A fresh pool on an empty cache compiles cfgs at m; returns its timings and cache."""
    compile_only, forked, shared = KINDS[kind]
    compilepool.FORK_COMPILE_ONLY = forked
    compilepool.SHARED_WARMUPS = shared
    cache = Path(tempfile.mkdtemp(prefix="cb-triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the workers inherit it
    t0 = time.perf_counter()
    pool = compilepool.CompilePool(workers, "builtin", shape.to_dict(), "bf16", 0,
                                   compile_only=compile_only)  # fmt: skip
    if pool.compile_only:
        from cellbench.tune.kernels.launch_policy import device_facts

        pool.assume_device(*device_facts("cuda:0"))
    try:
        pool.prefetch(m, cfgs)
        for c in cfgs:
            pool.wait(m, c)
        done_s = time.perf_counter() - t0
        ok = sum(1 for (_, k), f in pool._futures.items()
                 if not k.startswith("shared:") and f.result()[0])  # fmt: skip
        startup = pool.startup()
    finally:
        pool.close()
    return {"kind": kind, "compile_only": pool.compile_only, "start_method": pool.start_method,
            "all_compiled_s": round(done_s, 3),
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
        sys.exit("compile_workers_start_and_reuse.py needs a GPU")
    torch.cuda.set_device(0)
    shape = MoEShape(num_experts=128, intermediate_size=768, hidden_size=2048, topk=8)
    cfgs = gemm_configs(a.configs)
    runs = []
    names = list(KINDS)
    for r in range(a.rounds):
        for i in range(len(names)):
            kind = names[(i + r) % len(names)]  # rotate the order each round
            res = one_pool(kind, shape, a.m, cfgs, a.workers)
            res["round"] = r
            runs.append(res)
            su = {k: res["startup"].get(k, 0.0) for k in (
                "first_ready", "last_ready", "worker_started", "torch_imported",
                "kernels_imported", "ready")}  # fmt: skip
            print(f"round {r} {kind:>20} ({res['start_method']}): {res['compiled_ok']}/"
                  f"{len(cfgs)} compiled, all done {res['all_compiled_s']:.2f} s; workers "
                  f"ready {su['first_ready']:.2f}-{su['last_ready']:.2f} s (medians: up "
                  f"{su['worker_started']:.2f}, torch {su['torch_imported']:.2f}, kernels "
                  f"{su['kernels_imported']:.2f}, ready {su['ready']:.2f})",
                  flush=True)  # fmt: skip

    # Does the main process's launch load what the compile-only workers compiled, the
    # config-independent kernels included (the pool with shared warm-ups: nothing compiled
    # beforehand here)? One check per process: after it, this process holds the kernels.
    last = next(x for x in reversed(runs) if x["kind"] == "forked + shared")
    cache = Path(last["cache"])
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    backend = make_backend("builtin", shape, "bf16", torch.device("cuda", 0))
    prob = backend.make_problem(a.m, 0)
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
        f"kernels compiled by it: {added} (0 = every kernel it launched was the workers')"
    )

    def med(kind: str, key: str) -> float:
        vals = [x[key] if key in x else x["startup"].get(key, 0.0) for x in runs
                if x["kind"] == kind]  # fmt: skip
        return statistics.median(vals)

    for key in ("last_ready", "all_compiled_s"):
        print(f"median {key}: " + ", ".join(f"{k} {med(k, key):.2f} s" for k in names))
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
