"""Tuner parts without a tuning run: search spaces, pruning reasons, roofline arithmetic,
timing statistics, the vLLM JSON writer and the tuning log's handling of a torn last line.
Stand-in, why: hand-made timings where a test checks statistics or a pick, as real timings vary
run to run and the expected answer could not be stated (tests/stage/test_tuner_cli.py tunes for
real)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench.tune import artifacts, roofline, spaces
from cellbench.tune.timing import CPU_METHOD, relative_spread, time_calls

H200 = spaces.HardwareLimits(232_448, "cuda", "3.6.0")
REF = Path(__file__).resolve().parents[1] / "data" / "vllm-configs"


def test_space_sizes_match_vllm_counts() -> None:
    assert len(spaces.cuda_space()) == 1920
    assert len(spaces.cuda_space((128, 128))) == 640
    assert len(spaces.rocm_space(fp16=True, has_mfma=True)) == 40_000
    assert len(spaces.rocm_space(fp16=False)) == 8_000
    assert len(spaces.tiny_space()) == 16
    # every config is unique
    keys = {spaces.config_key(c) for c in spaces.cuda_space()}
    assert len(keys) == 1920


def test_config_key_is_order_independent() -> None:
    a = {
        "num_warps": 4,
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_stages": 2,
    }
    b = dict(sorted(a.items()))
    assert spaces.config_key(a) == spaces.config_key(b)
    assert list(json.loads(spaces.config_key(a)))[:2] == ["BLOCK_SIZE_M", "BLOCK_SIZE_N"]


def _cfg(bm, bn, bk, w=4, g=1, s=2):
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": g,
        "num_warps": w,
        "num_stages": s,
    }


def _why(cfg, m=4096, n=768, k=2048, ob=2, limits=H200):
    return spaces.prune_reason(cfg, m=m, n=n, k=k, operand_bytes=ob, limits=limits)


def test_pruning_reasons() -> None:
    assert _why(_cfg(64, 128, 64, s=3)) is None
    # shared memory: (5-1) * (256*256 + 256*256) * 2 bytes
    r = _why(_cfg(256, 256, 256, w=8, s=5))
    assert r is not None and "shared memory" in r and str(4 * 2 * 65536 * 2) in r
    # the same tiles fit with fp8 operands at fewer stages
    assert _why(_cfg(128, 128, 128, w=8, s=3), ob=1) is None
    # rows per expert: M=1 leaves at most one row per expert
    r = _why(_cfg(64, 64, 64), m=1)
    assert r is not None and "rows per expert" in r and "M=1" in r
    assert _why(_cfg(16, 64, 64), m=1) is None
    # block sizes beyond the problem's dims
    r = _why(_cfg(16, 256, 64), m=16, n=32, k=64)
    assert r is not None and "BLOCK_SIZE_N=256" in r
    r = _why(_cfg(16, 64, 128), m=16, n=32, k=64)
    assert r is not None and "BLOCK_SIZE_K=128" in r
    # registers: a 256x256 fp32 accumulator over 4 warps is 512 registers a thread
    r = _why(_cfg(256, 256, 64, w=4, s=2))
    assert r is not None and "registers" in r and "512" in r
    # Triton 3.6's known failure, only for that version on CUDA
    r = _why(_cfg(256, 64, 64, w=4, s=2))
    assert r is not None and "Triton 3.6" in r
    other = spaces.HardwareLimits(232_448, "cuda", "3.5.1")
    assert _why(_cfg(256, 64, 64, w=4, s=2), limits=other) is None
    # the CPU interpreter has no shared-memory or register limits
    cpu = spaces.HardwareLimits(None, "cpu", "3.6.0")
    assert _why(_cfg(256, 256, 256, w=8, s=5), limits=cpu) is None


def test_prune_counts_for_qwen3_on_h200() -> None:
    kept, dropped = spaces.prune(
        spaces.cuda_space(), m=4096, n=768, k=2048, operand_bytes=2, limits=H200
    )
    assert len(kept) + len(dropped) == 1920
    assert all(why for _, why in dropped)
    # the smem bound is a lower bound: it prunes fewer than the 588 measured to exceed it
    smem = [c for c, why in dropped if why.startswith("shared memory")]
    assert 0 < len(smem) <= 588


def test_roofline_hand_checked() -> None:
    # m=2 tokens, top-2, N=4, K=8, 3 experts touched, bf16 (2-byte) everything
    kw = dict(m=2, n=4, k=8, topk=2, experts_touched=3, weight_bytes=2, act_bytes=2, out_bytes=2)
    w = roofline.fused_work(**kw)
    assert w.flops == 2 * 2 * 2 * (2 * 4 * 8 + 4 * 8) == 768
    # weights 3 * (2N*K + K*N) * 2 = 576, input 2*8*2 = 32, output 32
    assert w.bytes == 576 + 32 + 32
    g1, g2 = roofline.gemm_works(**kw)
    assert g1.flops + g2.flops == w.flops
    # GEMM1: w1 of 3 experts (3*64*2=384) + x (32) + out (4 rows x 8 x 2 = 64)
    assert g1.bytes == 384 + 32 + 64
    # GEMM2: w2 (3*32*2=192) + in (4 rows x 4 x 2 = 32) + out (4 x 8 x 2 = 64)
    assert g2.bytes == 192 + 32 + 64
    ceil = roofline.Ceilings(copy_bytes_per_s=640e6, matmul_flops_per_s=768e6)
    f = roofline.fractions(w, 2.0, ceil)  # 2 us: floor is max(640/640e6, 768/768e6) = 1 us
    assert f["roofline_us"] == pytest.approx(1.0)
    assert f["roofline_fraction"] == pytest.approx(0.5)
    assert f["bw_fraction"] == pytest.approx(0.5)
    # block scales: (2N/bn)*(K/bk) + (K/bn)*(N/bk) fp32 per expert
    wb = roofline.fused_work(**kw, block_shape=(4, 4))
    assert wb.bytes - w.bytes == 3 * ((8 // 4) * (8 // 4) + (8 // 4) * (4 // 4)) * 4
    assert roofline.fractions(w, 2.0, roofline.Ceilings(None, None))["roofline_fraction"] is None


def test_relative_spread_and_cpu_timing() -> None:
    assert relative_spread([1.0, 1.0]) == 0.0
    assert relative_spread([9.0, 10.0, 10.0, 10.0, 11.0]) == pytest.approx(0.0)
    assert relative_spread([8.0, 9.0, 10.0, 11.0, 12.0]) == pytest.approx(0.1)
    calls = []
    t = time_calls([lambda: calls.append(1)], on_gpu=False, repeats=5)
    assert t.method == CPU_METHOD and len(t.samples_us) == 5 and t.median_us > 0
    assert len(calls) == 6  # one warm-up, five timed
    with pytest.raises(ValueError, match="repeats"):
        time_calls([lambda: None], on_gpu=False, repeats=0)


def test_vllm_json_matches_reference_format(tmp_path: Path) -> None:
    ref = json.loads((REF / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    entries = {int(k): v for k, v in ref.items() if k != "triton_version"}
    text = artifacts.vllm_config_json(entries, "3.6.0", rocm=False)
    got = json.loads(text)
    assert got.pop("triton_version") == "3.6.0"
    assert got == ref
    rocm_ref = json.loads(
        (
            REF
            / "E=64,N=768,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json"
        ).read_text()
    )
    entries = {int(k): v for k, v in rocm_ref.items() if k != "triton_version"}
    got = json.loads(artifacts.vllm_config_json(entries, rocm_ref["triton_version"], rocm=True))
    assert got == rocm_ref
    assert list(got)[0] == "triton_version"


def test_tuning_log_skips_torn_line(tmp_path: Path) -> None:
    log = artifacts.TuningLog(tmp_path / "log.jsonl")
    rec = {
        "m": 4,
        "key": "k1",
        "config": {},
        "stage": "halving-0",
        "status": "timed",
        "time_us": 12.5,
        "samples_us": [12.5],
    }
    log.append(rec)
    log.append({**rec, "key": "k2", "status": "failed", "reason": "boom"})
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"m": 4, "key": "k3", "sta')  # a killed writer's partial line
    again = artifacts.TuningLog(tmp_path / "log.jsonl")
    assert again.resumed == 2
    assert again.lookup(4, "k1", "halving-0")["time_us"] == 12.5
    assert again.lookup(4, "k3", "halving-0") is None
    assert again.failed_keys() == {"k2"}


def test_batch_sizes_split_over_gpus() -> None:
    from cellbench.tune.device_run import split_batch_sizes
    from cellbench.tune.plan import VLLM_DEFAULT

    parts = split_batch_sizes(VLLM_DEFAULT, 4)
    assert [m for p in parts for m in p] == VLLM_DEFAULT  # contiguous, nothing lost
    assert len(parts) == 4 and max(map(len, parts)) - min(map(len, parts)) <= 3
    assert split_batch_sizes([1, 2], 8) == [[1], [2]]  # never more workers than batch sizes


def test_tie_goes_to_the_seed_tables_config(tmp_path: Path) -> None:
    """Finalists within the measured spread tie; the seed table's (vLLM-shipped) config wins
    the tie even when another tied config needs less shared memory; outside the spread the
    faster config wins; a tie without the table's config goes to the lowest median."""
    from cellbench.tune.search import TuneOptions, build_tuner
    from cellbench.tune.timing import Timing

    shipped = _cfg(128, 256, 64, w=8, g=16, s=4)
    cheaper = _cfg(128, 256, 64, w=8, g=1, s=3)
    opts = TuneOptions(on_gpu=False, seed_table={4096: shipped})
    log = artifacts.TuningLog(tmp_path / "log.jsonl")
    t = build_tuner(None, [shipped, cheaper], n=768, k=2048, operand_bytes=2, limits=H200,
                    options=opts, log=log).final  # fmt: skip
    k_s, k_c = spaces.config_key(shipped), spaces.config_key(cheaper)
    noisy = [100.0, 98.0, 102.0, 99.0, 101.0]  # spread 1%
    tied = [
        (k_c, cheaper, Timing(100.0, noisy)),
        (k_s, shipped, Timing(100.5, [x + 0.5 for x in noisy])),
    ]
    e = t.pick(4096, tied, 2)
    assert e.config == shipped and e.ties == [spaces.describe(cheaper)]
    apart = [(k_c, cheaper, Timing(90.0, [90.0] * 5)), (k_s, shipped, Timing(100.0, [100.0] * 5))]
    assert t.pick(4096, apart, 2).config == cheaper
    # without the table's config in the tie, the lowest median wins, not the cheaper config
    wider = _cfg(128, 256, 128, w=8, g=1, s=3)
    k_w = spaces.config_key(wider)
    no_table = [(k_c, cheaper, Timing(100.4, noisy)), (k_w, wider, Timing(100.0, noisy))]
    e = t.pick(4096, no_table, 2)
    assert e.config == wider and e.ties == [spaces.describe(cheaper)]


@pytest.mark.parametrize("retimed_faster", ["other", "shipped"])
def test_a_tie_with_the_shipped_config_is_timed_again(tmp_path: Path, retimed_faster: str) -> None:
    """When vLLM's config ties with a finalist that measured faster, the two are timed again
    side by side (twice the repeats) and the median of all their samples picks, whichever
    way it falls; no second timing where the shipped config is ahead or out of the tie.
    Test double: the re-timing returns set samples (which of two near-equal configs a GPU
    finds faster cannot be caused here); the rule and the pick are the tuner's own."""
    from cellbench.tune.final_pick import FinalPick
    from cellbench.tune.search import TuneOptions, build_tuner
    from cellbench.tune.timing import Timing

    shipped = _cfg(128, 256, 64, w=8, g=16, s=4)
    other = _cfg(128, 256, 64, w=8, g=1, s=3)
    k_s, k_o = spaces.config_key(shipped), spaces.config_key(other)
    faster = k_o if retimed_faster == "other" else k_s
    asked: list[tuple[list[str], int, str]] = []

    class SetRetiming(FinalPick):
        def side_by_side(self, m, configs, problems, repeats, stage):
            asked.append(([k for k, _ in configs], repeats, stage))
            return [(k, c, Timing(99.0 if k == faster else 101.0, [99.0 if k == faster else
                                                                   101.0] * repeats))
                    for k, c in configs]  # fmt: skip

    opts = TuneOptions(on_gpu=False, seed_table={4096: shipped}, repeats=5)
    t = build_tuner(None, [shipped, other], n=768, k=2048, operand_bytes=2, limits=H200,
                    options=opts, log=artifacts.TuningLog(tmp_path / "log.jsonl"),
                    final_pick=SetRetiming).final  # fmt: skip
    noisy = [100.0, 98.0, 102.0, 99.0, 101.0]  # spread 1%
    tied = [(k_o, other, Timing(100.0, noisy)),
            (k_s, shipped, Timing(100.5, [x + 0.5 for x in noisy]))]  # fmt: skip
    final, settled = t.settle_tie(4096, tied, [])
    assert settled and asked == [([k_o, k_s], 10, "tiebreak")]
    e = t.pick(4096, final, 2, settled)
    assert spaces.config_key(e.config) == faster
    assert len(e.samples_us) == 15  # the final's 5 and the re-timing's 10
    # shipped ahead, or the other config faster beyond the noise: nothing timed again
    asked.clear()
    ahead = [(k_o, other, Timing(100.5, noisy)), (k_s, shipped, Timing(100.0, noisy))]
    apart = [(k_o, other, Timing(90.0, [90.0] * 5)), (k_s, shipped, Timing(100.0, [100.0] * 5))]
    assert t.settle_tie(4096, ahead, [])[1] is False
    assert t.settle_tie(4096, apart, [])[1] is False
    assert asked == []


def test_compile_pool_warms_configs_in_worker_processes() -> None:
    """The pool's plumbing: spawned workers take configs per batch size, and the main process
    waits on each exactly once. Here (no GPU, index -1) a builtin worker's compile-only
    warm-up is a no-op under the interpreter; the GPU test in test_kernel.py checks that it
    really compiles what the real call then uses."""
    from cellbench.tune.compilepool import CompilePool
    from cellbench.tune.shapes import MoEShape

    shape = MoEShape(num_experts=8, intermediate_size=32, hidden_size=64, topk=2)
    cfgs = [
        {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
         "num_warps": 4, "num_stages": 2}
        for bm in (16, 32)
    ]  # fmt: skip
    pool = CompilePool(2, "builtin", shape.to_dict(), "fp32", -1)
    # both workers start at construction (their imports overlap the caller's setup), not at
    # the first warm-up a batch size waits on
    assert len(pool._ex._processes) == 2
    try:
        pool.prefetch(4, cfgs)
        for cfg in cfgs + cfgs:  # the second wait on the same config counts nothing
            pool.wait(4, cfg)
        pool.wait(1, cfgs[0])  # not prefetched: queued by wait
    finally:
        pool.close()
    assert pool.warmed == 3 and pool.cpu_s >= 0.0
    pool.close()  # a second close (the CLI closes before measuring ceilings) does nothing


_COMPILE_ONLY_SCRIPT = """
import json, sys
from cellbench.tune.shapes import MoEShape
from cellbench.tune import compilepool, spaces
compilepool.FORK_COMPILE_ONLY = sys.argv[1] == "fork"
compilepool.SHARED_WARMUPS = True
good = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 2}
bad = {**good, "num_warps": 3}  # not a power of two
shape = MoEShape(num_experts=8, intermediate_size=128, hidden_size=256, topk=2)
pool = compilepool.CompilePool(1, "builtin", shape.to_dict(), "bf16", 0, compile_only=True)
try:
    pool.assume_device((9, 0), 132)
    pool.prefetch(64, [good, bad])
    pool.wait(64, good)
    pool.wait(64, bad)
    res = {k: list(f.result()[:2]) for (_, k), f in pool._futures.items()}
    startup = pool.startup()
finally:
    pool.close()
print(json.dumps({"compile_only": pool.compile_only, "start_method": pool.start_method,
                  "good": res[spaces.config_key(good)], "bad": res[spaces.config_key(bad)],
                  "startup": startup}))
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_compile_only_worker_builds_cuda_binaries_without_a_gpu(tmp_path: Path, start: str) -> None:
    """A compile-only worker never opens the GPU: told the device's facts by the main process,
    it compiles the builtin GEMMs and the batch size's shared kernels for sm_90 with
    Triton's real compiler (ptxas included) on this machine, which has no GPU and no CUDA
    driver; forked (the default: it inherits the
    main process's imports) or spawned. The binaries land in Triton's cache, where the
    owning process's launch finds them (tests/stage/test_kernel.py, on a GPU). A config the kernel
    rejects is reported, not raised. The main process runs in a subprocess with compiled,
    not interpreted, kernels (TRITON_INTERPRET=0): compiling needs no GPU, launching would."""
    cache = tmp_path / "triton-cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TRITON_INTERPRET": "0",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "workflow")}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", _COMPILE_ONLY_SCRIPT, start], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["compile_only"] and r["start_method"] == start
    assert r["good"][0], r["good"][1]
    assert not r["bad"][0] and "num_warps" in r["bad"][1]
    # the config's GEMMs, and the batch size's config-independent kernels (alignment for
    # its BLOCK_SIZE_M, SiLU-and-mul, top-k sum), which the main process would otherwise
    # compile itself
    cubins = {p.stem for p in cache.rglob("*.cubin")}
    assert cubins == {"_moe_gemm_kernel", "_align_small_kernel", "_silu_mul_kernel",
                      "_sum_topk_kernel"}, cubins  # fmt: skip
    su = r["startup"]
    assert su["workers"] == 1
    assert 0 <= su["worker_started"] <= su["torch_imported"] <= su["ready"]


def test_compile_pool_sends_guesses_only_to_idle_workers() -> None:
    """Speculative warm-ups wait in the pool while the workers are busy: a needed warm-up
    queued later runs before every guess still waiting, and a waiting guess that becomes
    needed is sent at once. Test double: one worker THREAD whose warm-ups block until the
    test releases them (a real worker's warm-up is over before the test could look); the
    scheduling code is the pool's own. Real worker processes: the test above."""
    import concurrent.futures as cf
    import threading

    from cellbench.tune.compilepool import CompilePool

    gate = threading.Semaphore(0)
    ran: list[int] = []

    def blocked_warm(m: int, cfg: dict) -> tuple[bool, str, float]:
        gate.acquire()
        ran.append(cfg["GROUP_SIZE_M"])
        return True, "", 0.0

    class GatedPool(CompilePool):
        _warm_task = staticmethod(blocked_warm)

        @staticmethod
        def _executor(workers, initargs, start_method):
            return cf.ThreadPoolExecutor(max_workers=workers)

    cfgs = {g: _cfg(16, 32, 32, g=g) for g in (1, 4, 8, 16, 32)}
    keys = {g: spaces.config_key(c) for g, c in cfgs.items()}
    pool = GatedPool(1, "builtin", {}, "fp32", -1)
    try:
        pool.prefetch(2, [cfgs[1]])  # needed: the worker takes it (and blocks)
        pool.prefetch(2, [cfgs[4], cfgs[8], cfgs[16]], speculative=True)
        assert pool.queued(2) == {keys[g] for g in (1, 4, 8, 16)}
        assert {k for _, k in pool._futures} == {keys[1]}  # the guesses wait: worker busy
        pool.prefetch(2, [cfgs[32]])  # needed: sent at once, behind G1 only
        pool.prefetch(2, [cfgs[16]])  # a waiting guess now needed: sent at once too
        assert {k for _, k in pool._futures} == {keys[g] for g in (1, 32, 16)}
        for _ in range(5):
            gate.release()
        for c in cfgs.values():
            pool.wait(2, c)
    finally:
        for _ in range(5):
            gate.release()
        pool.close()
    assert ran == [1, 32, 16, 4, 8], ran  # needed first, then the guesses in their order
    assert pool.warmed == 5


@pytest.mark.parametrize("first_m", [8, 1])
def test_default_mode_queues_the_next_batch_sizes_round0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_m: int
) -> None:
    """With a compile pool, default mode at one batch size queues, before it finishes, the new
    kernels the next batch size's round 0 is likely to need; that round then finds most of
    them queued already. From M=8 (structured search) and from M=1 on the few-token path
    (where every distinct kernel is screened). Real builtin kernel under the interpreter,
    real worker processes (whose compile-only warm-up does nothing on the CPU)."""
    import importlib

    import torch

    if torch.cuda.is_available():
        pytest.skip(
            "needs no GPU (a CPU-interpreter test): it builds the interpreter's setup (a backend "
            "on CPU tensors, interpreter limits, CPU compile workers), and Triton launches kernels "
            "on CPU tensors only under TRITON_INTERPRET, which is set only where there is no GPU"
        )
    from cellbench.tune.backends import make_backend
    from cellbench.tune.compilepool import CompilePool
    from cellbench.tune.search import TuneOptions, build_tuner
    from cellbench.tune.shapes import MoEShape

    policy = importlib.import_module("cellbench.tune.kernels.launch_policy")
    monkeypatch.setattr(policy, "DECODE_MAX_TOKENS", 2)  # M=1 on the few-token path
    shape = MoEShape(num_experts=8, intermediate_size=32, hidden_size=64, topk=2)
    backend = make_backend("builtin", shape, "fp32", "cpu")
    opts = TuneOptions(on_gpu=False, rotate=1, repeats=2, halving_repeats=(1, 2),
                       finalists=2, compile_budget=(6, 4), round0_max=6, local_rounds=1,
                       moves_per_round=2)  # fmt: skip
    log = artifacts.TuningLog(tmp_path / "log.jsonl")
    limits = spaces.HardwareLimits(None, "cpu", "interpreter")
    pool = CompilePool(2, "builtin", shape.to_dict(), "fp32", -1)
    try:
        tuner = build_tuner(backend, spaces.tiny_space(), n=32, k=64, operand_bytes=4,
                            limits=limits, options=opts, log=log, compile_pool=pool)  # fmt: skip
        tuner.search.next_m = {first_m: 64}
        tuner.tune_one(first_m)
        assert backend.kernel_path(backend.make_problem(first_m, 0)) == (
            "decode" if first_m == 1 else "grouped"
        )
        queued = pool.queued(64)
        assert queued, "nothing queued for the next batch size"
        tuner.tune_one(64)
    finally:
        pool.close()
    round0 = {r["key"] for r in log.records if r["m"] == 64 and r["stage"] == "halving-0"}
    assert len(queued & round0) * 2 >= len(queued)  # the guess mostly holds


def test_local_search_moves_nearest_first_with_coupled_tile_and_warps(tmp_path: Path) -> None:
    """The local search's moves: the nearest step of every kind before any second step, and
    BLOCK_SIZE_N doubled together with the warps. Replayed on the H200's fp8 exhaustive log
    (benchmarks/search_replay.py), that joint move is what reaches the M=4096 winner
    (N256, 8 warps) from the shipped N128, 4 warps, where N256 with 4 warps is slow."""
    from cellbench.tune.search import TuneOptions, build_tuner

    space = spaces.cuda_space((128, 128))
    by_key = {spaces.config_key(c): c for c in space}
    log = artifacts.TuningLog(tmp_path / "l.jsonl")
    t = build_tuner(None, space, n=768, k=2048, operand_bytes=1, limits=H200,
                    options=TuneOptions(on_gpu=False), log=log)  # fmt: skip
    start = _cfg(64, 128, 128, w=4, g=16, s=4)
    moves = [c for _, c in t.search.neighbours(start, by_key)]
    changed = [{k: v for k, v in c.items() if start[k] != v} for c in moves]
    assert changed[:2] == [{"num_stages": 5}, {"num_warps": 8}]  # first steps of each kind
    assert {"BLOCK_SIZE_N": 256, "num_warps": 8} in changed
    assert changed.index({"num_stages": 2}) > changed.index({"BLOCK_SIZE_N": 256, "num_warps": 8})
    assert all(len(c) in (1, 2) for c in changed) and len(moves) == len(set(map(str, moves)))
    assert all(c["BLOCK_SIZE_K"] == 128 for c in moves)  # only configs of the space


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RECORDED = {  # exhaustive runs on an H200 with every timed sample (runs 15 and 16)
    "bf16": RESULTS / "tuner_h200_2026-12-03_bf16-6ms-both_run15_log-exhaustive.jsonl.gz",
    "fp8": RESULTS / "tuner_h200_2026-12-03_fp8-6ms-both_run16_log-exhaustive.jsonl.gz",
}


@pytest.mark.parametrize("dtype", sorted(RECORDED))
def test_default_search_replayed_on_recorded_h200_timings(dtype: str, monkeypatch) -> None:
    """Default mode (the real Tuner, GPU options) on the timings an H200 exhaustive run
    recorded, each timing drawn from that config's samples (benchmarks/search_replay.py):
    its picks sit near the best recorded median at every batch size, within the compile
    budget, and at fp8 M=4096 it reaches the N256 / 8-warp winner the joint tile-and-warps
    move exists for. Bounds are loose where the recorded screen drifted (3 % at M=4096)."""
    import statistics
    import sys

    monkeypatch.syspath_prepend(str(RESULTS.parent))
    import search_replay
    from cellbench.tune.search import TuneOptions

    first, later = TuneOptions().compile_budget  # type: ignore[misc]
    rows = {r["M"]: r for r in search_replay.evaluate(RECORDED[dtype], seeds=4)}
    assert sorted(rows) == [1, 16, 64, 256, 1024, 4096]
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    assert policy.DECODE_MAX_TOKENS is None  # the replay put the CUDA path rule back
    assert policy.PERSISTENT_GEMMS == (1, 2)  # and the persistence rule (off for these logs)
    for m, r in rows.items():
        assert statistics.median(r["ratios"]) <= (1.01 if m <= 256 else 1.03), (m, r)
        if dtype == "bf16" and m == 1:  # the few-token path: every distinct kernel, as exhaustive
            assert r["timed_median"] == r["exhaustive_timed"], r
            continue
        # the compile budget: FIRST at the first batch size of a kernel specialisation and at
        # one far from the size before it (here every size is 4x or more above the last)
        prev = max((x for x in rows if x < m), default=None)
        far = prev is None or math.log2(m / prev) > TuneOptions().near_log2
        assert r["new_median"] <= (first if m in (1, 16, 64) or far else later), (m, r)
        assert r["timed_median"] < r["exhaustive_timed"], (m, r)
    if dtype == "fp8":
        # the N256 / 8-warp tile (GROUP_SIZE_M 16 or 32: 0.7% apart in the recorded screen)
        tile = sum(n for p, n in rows[4096]["picks"].items() if p.startswith("M64_N256_K128_G")
                   and p.endswith("_w8_s4"))  # fmt: skip
        assert tile >= 3, rows[4096]
