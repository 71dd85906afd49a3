"""Timing of kernel calls: CUDA/HIP graphs on a GPU, wall clock under the CPU interpreter.

In-container module: stdlib + torch.

GPU method (as vLLM's tuner): warm up once outside the graph (compiles), capture a graph of
`graph_calls` consecutive calls that rotate over several input sets (so small shapes are not
flattered by a warm cache), replay it a few times to warm up, then take the median of
`repeats` replays, each timed with device events, divided by `graph_calls`.

CPU method (TRITON_INTERPRET=1): the median of a few wall-clock calls. These are interpreter
timings: they rank configs for the interpreter only and say nothing about GPU speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Timing", "time_calls", "relative_spread", "GPU_METHOD", "CPU_METHOD"]

GPU_METHOD = "device-graph"
GPU_EVENTS_METHOD = "device-events"
CPU_METHOD = "interpreter-wallclock"


@dataclass
class Timing:
    """Per-call times of one config (microseconds)."""

    median_us: float
    samples_us: list[float] = field(default_factory=list)
    method: str = GPU_METHOD
    abandoned: bool = False  # stopped after the first sample: far slower than the best so far
    wall_s: float = 0.0  # wall time spent timing (the device busy time, roughly)
    # where wall_s went on a GPU (seconds): the first eager call (it loads a kernel new to
    # this process), the other eager calls, graph capture, warm-up replays, timed replays
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def spread(self) -> float:
        """Relative spread of the samples (see `relative_spread`)."""
        return relative_spread(self.samples_us)


def relative_spread(samples: Sequence[float]) -> float:
    """Half the inter-quartile range over the median (0 for fewer than 3 samples).

    Two medians closer than about this fraction are not told apart by these samples.
    """
    if len(samples) < 3:
        return 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    med = statistics.median(samples)
    return (q[2] - q[0]) / 2 / med if med > 0 else 0.0


def _time_cpu(
    calls: Sequence[Callable[[], object]], repeats: int, abandon_above_us: float | None
) -> Timing:
    t_start = time.perf_counter()
    calls[0]()  # warm-up (the interpreter has per-call setup worth keeping out)
    samples: list[float] = []
    abandoned = False
    for i in range(repeats):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        samples.append((time.perf_counter() - t0) * 1e6)
        if i == 0 and abandon_above_us is not None and samples[0] > abandon_above_us:
            abandoned = True
            break
    return Timing(
        statistics.median(samples),
        samples,
        CPU_METHOD,
        abandoned,
        time.perf_counter() - t_start,
    )


def _time_gpu(
    calls: Sequence[Callable[[], object]],
    graph_calls: int,
    warmup: int,
    repeats: int,
    abandon_above_us: float | None,
) -> Timing:
    import torch

    t_start = time.perf_counter()
    calls[0]()  # compiles, or loads from the cache, a kernel new to this process
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    for c in calls[1:]:  # touch every other input set once
        c()
    torch.cuda.synchronize()
    t_eager = time.perf_counter()
    method = GPU_METHOD
    holder: list = []
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(graph_calls):
                calls[i % len(calls)]()
        torch.cuda.synchronize()
        holder.append(g)
    except Exception:  # noqa: BLE001 - some kernels/drivers cannot be captured: time launches
        method = GPU_EVENTS_METHOD
        torch.cuda.synchronize()

    def replay() -> None:
        if holder:
            holder[0].replay()
        else:
            for i in range(graph_calls):
                calls[i % len(calls)]()

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def one() -> float:
        start.record()
        replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / graph_calls

    samples: list[float] = []
    abandoned = False
    t_capture = time.perf_counter()
    first = one()  # also serves as the first warm-up replay
    t_warm = t_capture
    if abandon_above_us is not None and first > abandon_above_us:
        samples, abandoned = [first], True
    else:
        for _ in range(max(warmup - 1, 0)):
            replay()
        torch.cuda.synchronize()
        t_warm = time.perf_counter()
        samples = [one() for _ in range(repeats)]
    holder.clear()
    t_end = time.perf_counter()
    phases = {
        "first": t_first - t_start,
        "eager": t_eager - t_first,
        "capture": t_capture - t_eager,
        "warm": t_warm - t_capture,
        "timed": t_end - t_warm,
    }
    return Timing(statistics.median(samples), samples, method, abandoned, t_end - t_start, phases)


def time_calls(
    calls: Sequence[Callable[[], object]],
    *,
    on_gpu: bool,
    graph_calls: int = 10,
    warmup: int = 5,
    repeats: int = 20,
    abandon_above_us: float | None = None,
) -> Timing:
    """Time one config given closures over rotating input sets (one closure per set).

    abandon_above_us: stop after the first sample when it is above this (the config is far
    slower than the best so far); the result is marked `abandoned`.
    """
    if not calls:
        raise ValueError("time_calls needs at least one call")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    if on_gpu:
        return _time_gpu(calls, graph_calls, warmup, repeats, abandon_above_us)
    return _time_cpu(calls, repeats, abandon_above_us)


def time_side_by_side(
    call_sets: Sequence[Sequence[Callable[[], object]]],
    *,
    on_gpu: bool,
    graph_calls: int = 10,
    repeats: int = 20,
) -> list[Timing]:
    """Time several configs interleaved (A B C A B C ...), so drifts hit them all alike."""
    if not on_gpu:
        out = [_time_cpu(cs, 1, None) for cs in call_sets]  # warm each first
        samples: list[list[float]] = [[] for _ in call_sets]
        t0 = time.perf_counter()
        for r in range(repeats):
            for j, cs in enumerate(call_sets):
                t = time.perf_counter()
                cs[r % len(cs)]()
                samples[j].append((time.perf_counter() - t) * 1e6)
        wall = (time.perf_counter() - t0) / max(len(call_sets), 1)
        return [
            Timing(statistics.median(s), s, CPU_METHOD, False, wall + o.wall_s)
            for s, o in zip(samples, out, strict=True)
        ]

    import torch

    t_start = time.perf_counter()
    graphs = []
    for cs in call_sets:
        for c in cs:
            c()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(graph_calls):
                cs[i % len(cs)]()
        graphs.append(g)
    torch.cuda.synchronize()
    for g in graphs:  # warm-up
        for _ in range(3):
            g.replay()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = [[] for _ in call_sets]
    for _ in range(repeats):
        for j, g in enumerate(graphs):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            samples[j].append(start.elapsed_time(end) * 1e3 / graph_calls)
    wall = (time.perf_counter() - t_start) / max(len(call_sets), 1)
    del graphs
    return [Timing(statistics.median(s), s, GPU_METHOD, False, wall) for s in samples]
