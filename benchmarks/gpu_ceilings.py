"""What this GPU reaches at most, measured here, and the timing primitives the kernel
benchmarks share: copy and read bandwidth, dense matmul rates, a plain Triton read of the
bytes M=1 streams (with and without chaining); CUDA-event and CUDA-graph timing; the roofline
floor of one fused-MoE problem. Split out of kernel_vs_roofline.py, which uses all of it."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:  # the annotation only: no path set-up needed to import this module
    from cellbench.tune.shapes import MoEShape

REPLAYS = 25


def event_median(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over reps, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ceilings() -> dict[str, float]:
    """Device copy bandwidth (bytes read + written) and dense matmul rates, measured here."""
    n = 1 << 30  # 1 GiB each way
    bufs = [torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda") for _ in range(2)]
    ms = event_median(lambda: bufs[1].copy_(bufs[0]), 20)
    out = {"copy_GBps": 2 * n / ms / 1e6}
    bufs.clear()
    # Read-only streaming (a sum), the relevant ceiling for weight-reading GEMMs.
    bufs.append(torch.randn(n // 2, device="cuda"))  # 2 GiB of float32
    ms = event_median(lambda: bufs[0].sum(), 20)
    out["read_GBps"] = 4 * bufs[0].numel() / ms / 1e6
    bufs.clear()
    # The same read at the size M=1 streams (8 experts' bf16 weights, 75.5 MB), in a graph of
    # 8 reads of different buffers as the kernel timings are: what one short stream reaches.
    small = [torch.randn(75_497_472 // 4, device="cuda") for _ in range(8)]
    out["read_75MB_GBps"] = 4 * small[0].numel() / (graph_time_us(
        [lambda t=t: t.sum() for t in small]) * 1e-6) / 1e9  # fmt: skip
    small.clear()
    s = 8192
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    ms = event_median(lambda: a @ b, 20)
    out["bf16_TFLOPs"] = 2 * s**3 / ms / 1e9
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device="cuda")
        ms = event_median(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), 20)
        out["fp8_TFLOPs"] = 2 * s**3 / ms / 1e9
    except Exception as e:  # noqa: BLE001 - report and fall back to the bf16 ceiling
        print(f"# fp8 matmul ceiling not measured ({type(e).__name__}: {e}); using bf16's")
        out["fp8_TFLOPs"] = out["bf16_TFLOPs"]
    return out


def graph_time_us(calls: list) -> float:
    """Median microseconds per call of a CUDA graph replaying `calls` in order."""
    for f in calls:  # compile, prepare, warm up outside the graph
        f()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in calls:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    torch.cuda.synchronize()
    return event_median(g.replay, REPLAYS) * 1e3 / len(calls)


def roofline(shape: MoEShape, problems, ceil: dict[str, float], fp8: bool) -> dict[str, float]:
    """Floor time (us) from bytes and FLOPs, averaged over the rotated routings."""
    n, k, topk = shape.intermediate_size, shape.hidden_size, shape.topk
    m = problems[0].m
    wbytes = 1 if fp8 else 2
    per_expert = 3 * n * k * wbytes
    if fp8 and shape.block_shape:
        bn, bk = shape.block_shape
        per_expert += 4 * ((2 * n // bn) * (k // bk) + (k // bn) * (n // bk))
    used = statistics.mean(len(torch.unique(p.topk_ids)) for p in problems)
    nbytes = used * per_expert + 2 * m * k * 2  # weights touched + bf16 tokens in and out
    flops = 2 * m * topk * 3 * n * k
    rate = ceil["fp8_TFLOPs"] if fp8 else ceil["bf16_TFLOPs"]
    # Nearly all bytes are weight reads: the read ceiling (or copy, if higher) bounds them.
    t_mem = nbytes / (max(ceil["read_GBps"], ceil["copy_GBps"]) * 1e3)  # us
    t_flop = flops / (rate * 1e6)  # us
    return {"experts_used": used, "MB": nbytes / 1e6, "t_mem_us": t_mem, "t_flop_us": t_flop,
            "floor_us": max(t_mem, t_flop)}  # fmt: skip


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, per_prog, n, BLOCK: tl.constexpr, CHAINED: tl.constexpr):
    """Sum of one contiguous slice per program (a pure weight-like stream). CHAINED: launched
    early, waits for the previous kernel first, as a chained GEMM 2 does. (Run 5, commit
    b64ee0c, instead asked L2 for the slice before waiting: 39 us against 27 unchained.)"""
    start = tl.program_id(0).to(tl.int64) * per_prog
    if CHAINED:
        tl.extra.cuda.gdc_wait()
    else:
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, per_prog, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def stream_ceiling() -> list[dict]:
    """What a plain Triton read reaches on the bytes M=1 streams (75.5 MB of bf16, 8 buffers
    rotated in a graph), by grid size; and the same bytes as two launches (50.3 + 25.2 MB,
    GEMM 1's and GEMM 2's share), unchained and chained like the GEMMs."""
    total = 75_497_472 // 2  # bf16 elements
    bufs = [torch.randn(total, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    sink = torch.empty(1 << 16, device="cuda")
    rows = []

    def launch(x, lo, hi, progs, block, warps, chained):
        n = hi - lo
        per = triton.cdiv(triton.cdiv(n, progs), block) * block
        grid = (triton.cdiv(n, per),)
        _stream_read_kernel[grid](
            x[lo:],
            sink,
            per,
            n,
            BLOCK=block,
            CHAINED=chained,
            num_warps=warps,
            **({"launch_pdl": True} if chained else {}),
        )

    def one(progs, block, warps):
        return [lambda x=x: launch(x, 0, total, progs, block, warps, False) for x in bufs]

    def two(progs, block, warps, chained):
        cut = total * 2 // 3
        return [lambda x=x: (launch(x, 0, cut, progs * 2 // 3, block, warps, False),
                             launch(x, cut, total, progs // 3, block, warps, chained))
                for x in bufs]  # fmt: skip

    best = None
    for progs in (132, 264, 528, 1056, 2112):
        for block, warps in ((2048, 4), (4096, 8), (8192, 8)):
            us = graph_time_us(one(progs, block, warps))
            rows.append({"kind": "one", "programs": progs, "block": block, "warps": warps,
                         "us": us, "GBps": 2 * total / us / 1e3})  # fmt: skip
            print(
                f"  stream 75.5 MB one launch: {progs} programs block {block} w{warps}: "
                f"{us:.1f} us = {2 * total / us / 1e3:.0f} GB/s",
                flush=True,
            )
            if best is None or us < best[0]:
                best = (us, progs, block, warps)
    _, progs, block, warps = best
    for r in range(3):
        for chained in (False, True) if r % 2 == 0 else (True, False):
            us = graph_time_us(two(progs, block, warps, chained))
            rows.append({"kind": "two-chained" if chained else "two", "programs": progs,
                         "block": block, "warps": warps, "us": us,
                         "GBps": 2 * total / us / 1e3})  # fmt: skip
            print(
                f"  stream 75.5 MB as 50.3 + 25.2 MB, {'chained' if chained else 'unchained'}: "
                f"{us:.1f} us = {2 * total / us / 1e3:.0f} GB/s",
                flush=True,
            )
    return rows
