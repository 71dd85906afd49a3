"""Compile candidate configs in worker processes while the main process times on the GPU.

In-container module: stdlib + torch (+ triton through the backend).

Builtin kernel: a worker compiles a candidate without running it (`kernels.warm_config`,
placeholder tensors of the real shapes and dtypes): no weights, no GPU memory, no GPU time
taken from the timings. Triton stores the binary in its on-disk cache; the main process's
first launch of that config only loads it, since the specialisation (shapes, strides,
dtypes, alignment) is the same. vLLM's kernel has no compile-only entry point, so there a
worker builds the backend and runs the candidate once on a problem of the same batch size.
A worker that hits a compile error just reports it; the main process meets the same error
when it times the config and logs it as a failure.

Builtin kernel on CUDA: the workers never open the GPU. Each one would otherwise create a
CUDA context at start-up, fifteen at once on one device, before its first compile. Triton's
JIT asks its driver three things when it only compiles (the target, the current device and
stream), and the kernels ask two (compute capability, SM count): the main process states
them (`CompilePool.assume_device`) and a worker answers from that. The cache key is the
same as the main process's, so its launch finds the worker's binary. Such workers are
forked from the main process before it opens the GPU, so they start with torch, triton and
the kernels imported (a spawned worker imports them again: ~4-5 s on the H200 machine, the
bulk of its start-up).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import resource
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from cellbench.tune.spaces import config_key

__all__ = ["CompilePool", "COMPILE_ONLY_WORKERS", "FORK_COMPILE_ONLY", "SHARED_WARMUPS"]

# Default for CompilePool(compile_only=None), and whether compile-only workers are forked
# (see CompilePool._start_method); benchmarks/compile_workers_start_and_reuse.py flips them to
# compare.
COMPILE_ONLY_WORKERS = True
FORK_COMPILE_ONLY = True
# Whether compile-only workers also compile each batch size's config-independent kernels
# (see CompilePool.prefetch). On, from run 25 on the H200: the GPU test (the real call then
# compiles nothing at all) passed, and fp8 default mode over six batch sizes took 25.9 s of
# wall and 12.0 GPU-seconds with it, against 27.8 s and 17.6 without, on the same machine
# (the workers' waits rose from 7.0 to 10.5 s: they now compile those kernels too).
# CELLBENCH_SHARED_WARMUPS=0 turns it off in the tuner's process.
SHARED_WARMUPS = os.environ.get("CELLBENCH_SHARED_WARMUPS", "1") != "0"

_W: dict[str, Any] = {}
_PKG = __name__.rsplit(".", 1)[0]  # "cellbench.tune"


def _is_hip() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None))


def _init(
    backend_name: str,
    shape_dict: dict[str, Any],
    act_dtype: str,
    device_index: int,
    compile_only: bool,
    started: float,
):
    phases = {"pool_created": started, "worker_started": time.time()}
    if compile_only:
        # compiled code, not the interpreter, and no question to CUDA from the kernels package
        os.environ["TRITON_INTERPRET"] = "0"
    import torch

    phases["torch_imported"] = time.time()
    from cellbench.tune.shapes import MoEShape

    torch.set_num_threads(1)  # many workers share the cores
    device = "cpu"  # index -1: the CPU interpreter (only to exercise the pool)
    if device_index >= 0:
        device = f"cuda:{device_index}"
    shape = MoEShape.from_dict(shape_dict)
    _W.update(shape=shape, act_dtype=act_dtype, device=device, problems={}, facts=None)
    if backend_name == "builtin":
        from cellbench.tune.kernels import warm_config

        _W["warm_config"] = warm_config
    phases["kernels_imported"] = time.time()
    if device_index >= 0 and not compile_only:
        torch.cuda.set_device(device_index)
    if backend_name != "builtin":
        from cellbench.tune.backends import make_backend

        _W["backend"] = make_backend(backend_name, shape, act_dtype, device)
    phases["ready"] = time.time()
    _W["phases"] = phases


def _reported(work: Any) -> tuple[bool, str, float, dict[str, float] | None]:
    """Run one warm-up; returns (ok, error message, CPU seconds, start-up phases or None).
    An error is reported, not raised: the main process meets it again when it times the
    config and logs it as a failure (or compiles a shared kernel itself)."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        work()
        ok, msg = True, ""
    except Exception as e:  # noqa: BLE001 - reported, see above
        ok, msg = False, f"{type(e).__name__}: {str(e)[:200]}"
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return ok, msg, cpu, _take_phases()


def _warm_shared(
    m: int, block_m: int | None, facts: dict[str, Any] | None
) -> tuple[bool, str, float, dict[str, float] | None]:
    """Compile the config-independent kernels of a call of m tokens (compile-only workers;
    see `kernels.warm_shared`): block_m's alignment, or without it the rest."""
    import importlib

    def work() -> None:
        _prepare_device(facts)
        kernels = importlib.import_module(f"{_PKG}.kernels")
        kernels.warm_shared(_W["shape"], m, _W["act_dtype"], _W["device"], block_m)

    return _reported(work)


def _take_phases() -> dict[str, float] | None:
    """This worker's start-up timestamps, once (the pool gathers them from task results)."""
    return _W.pop("phases", None)


class _CompileOnlyDriver:
    """What Triton's JIT asks its driver when it compiles without launching (warm-up): the
    target, the current device and stream. Loading or launching a kernel needs the real
    driver, and a compile-only worker never does either."""

    def __init__(self, target: Any, device_index: int):
        self.target = target
        self.device_index = device_index

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return self.device_index

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _assume(facts: dict[str, Any]) -> None:
    """Compile for the GPU the main process described, without opening it."""
    import importlib

    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    policy = importlib.import_module(f"{_PKG}.kernels.launch_policy")
    cap = tuple(facts["capability"])
    policy.assume_device(_W["device"], cap, facts["sm_count"])
    target = GPUTarget("cuda", cap[0] * 10 + cap[1], 32)
    driver.set_active(_CompileOnlyDriver(target, int(_W["device"].split(":")[1])))
    _W["facts"] = facts


def _prepare_device(facts: dict[str, Any] | None) -> None:
    """Before a warm-up: a builtin worker told the GPU's facts compiles from them; one that
    opens the GPU has done so in `_init`. A compile-only worker told nothing opens it now
    (spawned), or fails here (forked: CUDA does not survive a fork), and the failure is
    reported: the main process then compiles for itself."""
    import torch

    if facts is not None and _W["facts"] is None and "warm_config" in _W:
        _assume(facts)
    elif _W["facts"] is None and _W["device"] != "cpu" and not torch.cuda.is_initialized():
        torch.cuda.set_device(_W["device"])


def _ready() -> tuple[bool, str, float, dict[str, float] | None]:
    """Nothing to do: submitting one per worker makes the executor start its processes now."""
    return True, "", 0.0, _take_phases()


def _warm(
    m: int, cfg: dict[str, int], facts: dict[str, Any] | None = None
) -> tuple[bool, str, float, dict[str, float] | None]:
    import torch

    def work() -> None:
        _prepare_device(facts)
        if "warm_config" in _W:
            _W["warm_config"](_W["shape"], m, _W["act_dtype"], cfg, _W["device"])
            return
        be = _W["backend"]
        probs = _W["problems"]
        if m not in probs:
            probs.clear()  # one batch size at a time: keeps memory flat
            probs[m] = be.make_problem(m, 0)
        be.output(probs[m], cfg)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            # cached blocks of every worker add up: 12 workers held 5.85 GiB each at M=8192
            # (fp8, one H100), and M=16384 ran out of GPU memory
            torch.cuda.empty_cache()

    return _reported(work)


class CompilePool:
    """A pool of `workers` processes warming configs up for one backend on one GPU.

    Two kinds of warm-up: needed ones (a batch size is about to time them) go to the workers
    at once, in order; speculative ones (guesses: the local search's likely moves, the next
    batch size's likely round 0) wait here and go to a worker only when one would otherwise
    idle, so a guess never delays a kernel the GPU is waiting for. A speculative warm-up that
    becomes needed before it started is sent at once."""

    def __init__(
        self,
        workers: int,
        backend_name: str,
        shape_dict: dict[str, Any],
        act_dtype: str,
        device_index: int,
        compile_only: bool | None = None,
    ):
        """compile_only: workers that never open the GPU (see the module); None = wherever
        that works (the builtin kernel on CUDA), False = each worker opens it."""
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        if compile_only is None:
            compile_only = COMPILE_ONLY_WORKERS
        self.compile_only = bool(
            compile_only and backend_name == "builtin" and device_index >= 0 and not _is_hip()
        )
        self.started = time.time()
        self.start_method = self._start_method()
        self._ex = self._executor(workers, (backend_name, shape_dict, act_dtype, device_index,
                                            self.compile_only, self.started),
                                  self.start_method)  # fmt: skip
        self._facts: dict[str, Any] | None = None
        # the batch size a worker runs a warm-up at, given the one asked for (the tuner sets a
        # smaller one that compiles the same kernels); None: the one asked for
        self.warm_m: Callable[[int], int] | None = None
        self._workers = workers
        self._futures: dict[tuple[int, str], cf.Future] = {}
        # speculative warm-ups not sent yet, in order. _lock guards them, the futures and the
        # count of tasks sent and not done: done-callbacks run on the executor's thread.
        self._guesses: dict[tuple[int, str], tuple[Any, tuple[Any, ...]]] = {}  # task, args
        self._in_flight = 0
        # re-entrant: a task that finishes before its callback is added runs the callback here
        self._lock = threading.RLock()
        self._closed = False
        self.wait_s = 0.0
        # The executor starts a process only when a task finds no idle one, so without this
        # the workers' imports (torch, triton, CUDA) would land in the first batch size's
        # compile wait instead of overlapping the main process's setup.
        with self._lock, warnings.catch_warnings():
            # Python warns when it forks a process that has threads (the CUDA driver's, once
            # CUDA is initialised); a forked worker here never calls CUDA, and malloc and the
            # interpreter's own locks are fork-safe.
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)  # fmt: skip
            self._ready_futures = [self._submit(_ready) for _ in range(workers)]

    _warm_task = staticmethod(_warm)  # what a worker runs for one warm-up
    _shared_task = staticmethod(_warm_shared)  # ... for a batch size's shared kernels

    def assume_device(self, capability: tuple[int, int], sm_count: int) -> None:
        """State the GPU's facts for compile-only workers (call before the first warm-up;
        without them a compile-only worker opens the GPU after all)."""
        self._facts = {"capability": list(capability), "sm_count": int(sm_count)}

    def startup(self) -> dict[str, float]:
        """Worker start-up, in seconds after the pool was created (medians over the workers
        heard from so far): process started, torch imported, kernels imported, ready
        (GPU opened where the workers open it); 'first_ready' and 'last_ready' too."""
        phases = []
        for fut in list(self._futures.values()) + self._ready_futures:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                r = fut.result()
                if len(r) > 3 and r[3]:
                    phases.append(r[3])
        if not phases:
            return {}
        out: dict[str, float] = {"workers": float(len(phases))}
        for name in ("worker_started", "torch_imported", "kernels_imported", "ready"):
            out[name] = statistics.median(p[name] - p["pool_created"] for p in phases)
        ready = [p["ready"] - p["pool_created"] for p in phases]
        out["first_ready"], out["last_ready"] = min(ready), max(ready)
        return out

    def _start_method(self) -> str:
        """'fork' for compile-only workers: a forked worker starts with torch, triton and the
        kernels already imported, which a spawned one spends ~4-5 s on (H200 machine, run
        21). 'spawn' where a worker opens the GPU: CUDA does not survive a fork."""
        if not (self.compile_only and FORK_COMPILE_ONLY):
            return "spawn"
        from cellbench.tune import (
            kernels,  # imported here, before the fork, so that every worker has it
        )

        if kernels.interpreter_active():  # forked workers would inherit interpreted kernels
            return "spawn"
        return "fork"

    @staticmethod
    def _executor(workers: int, initargs: tuple[Any, ...], start_method: str) -> cf.Executor:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        return cf.ProcessPoolExecutor(
            max_workers=workers,
            mp_context=mp.get_context(start_method),
            initializer=_init,
            initargs=initargs,
        )

    def _args(self, m: int, cfg: dict[str, int]) -> tuple[Any, ...]:
        if self.warm_m is not None:
            m = self.warm_m(m)
        return (m, cfg) if self._facts is None else (m, cfg, self._facts)

    def _submit(self, fn: Any, *args: Any) -> cf.Future:
        """Send a task to the workers (caller holds _lock)."""
        self._in_flight += 1
        fut = self._ex.submit(fn, *args)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: cf.Future) -> None:
        with self._lock:
            self._in_flight -= 1
            self._feed()

    def _feed(self) -> None:
        """Send speculative warm-ups while a worker would otherwise idle."""
        with self._lock:
            while not self._closed and self._guesses and self._in_flight < self._workers:
                k = next(iter(self._guesses))
                fn, args = self._guesses.pop(k)
                self._futures[k] = self._submit(fn, *args)

    def _queue(self, k: tuple[int, str], fn: Any, args: tuple[Any, ...], speculative: bool):
        """Send a warm-up now, or keep it as a guess (caller holds _lock)."""
        if k in self._futures:
            return
        if speculative:
            self._guesses.setdefault(k, (fn, args))
        else:
            self._guesses.pop(k, None)
            self._futures[k] = self._submit(fn, *args)

    def _shared_keys(self, m: int, configs: list[dict[str, int]]) -> list[tuple[tuple, tuple]]:
        """The config-independent warm-ups a batch size's configs need, as (key, task args):
        compile-only workers only (elsewhere the main process compiles these on first use,
        as it always did)."""
        if not (self.compile_only and SHARED_WARMUPS):
            return []
        out = [((m, "shared:rest"), (m, None))]
        for bm in sorted({int(c["BLOCK_SIZE_M"]) for c in configs}):
            out.append(((m, f"shared:align{bm}"), (m, bm)))
        return out

    def prefetch(self, m: int, configs: list[dict[str, int]], speculative: bool = False) -> None:
        """Queue warm-ups for `configs` at batch size m: needed ones are sent now (one that
        waits as a guess too), speculative ones wait for an idle worker (see the class).
        With SHARED_WARMUPS, compile-only workers also get, first, the batch size's
        config-independent kernels (alignment per BLOCK_SIZE_M, activation, quantisation,
        sums: `warm_shared`), which the main process otherwise compiles itself, one after
        another, at its first call of a new specialisation (run 22's fp8 log has a ~0.5 s
        gap at each new BLOCK_SIZE_M, inferred to be its alignment kernel compiling)."""
        with self._lock:
            for k, (mm, bm) in self._shared_keys(m, configs):
                self._queue(k, self._shared_task, (mm, bm, self._facts), speculative)
            for cfg in configs:
                k = (m, config_key(cfg))
                self._queue(k, self._warm_task, self._args(m, cfg), speculative)
            self._feed()

    def queued(self, m: int) -> set[str]:
        """Config keys with a warm-up queued (sent or waiting) at batch size m."""
        with self._lock:
            waiting = {k for mm, k in self._guesses if mm == m}
            keys = waiting | {k for mm, k in self._futures if mm == m}
        return {k for k in keys if not k.startswith("shared:")}

    def wait(self, m: int, cfg: dict[str, int]) -> None:
        """Block until cfg's warm-up at m is done (queues it first if needed), and its
        config-independent warm-ups where there are any."""
        with self._lock:
            self.prefetch(m, [cfg])  # as needed: sends what is still a guess or not queued
            keys = [sk for sk, _ in self._shared_keys(m, [cfg])] + [(m, config_key(cfg))]
            futs = [self._futures[x] for x in keys]
        t0 = time.perf_counter()
        for fut in futs:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - a dead worker: the main process compiles itself
                pass
        self.wait_s += time.perf_counter() - t0

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every finished warm-up, speculative ones (never waited on) too."""
        total = 0.0
        for fut in list(self._futures.values()):
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                total += fut.result()[2]
        return total

    @property
    def warmed(self) -> int:
        """Warm-ups finished (compiled, or reported a compile error)."""
        return sum(1 for f in list(self._futures.values()) if f.done() and not f.cancelled())

    def close(self) -> None:
        """Drop waiting guesses, cancel queued warm-ups and stop the workers (a second call
        does nothing)."""
        with self._lock:
            self._closed = True
            self._guesses.clear()
        for f in list(self._futures.values()):
            f.cancel()
        self._ex.shutdown(wait=True, cancel_futures=True)
