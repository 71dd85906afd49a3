"""The search's shared types: its knobs (`TuneOptions`), what it keeps per batch size
(`Entry`) and over the run (`Stats`), which kernels it compiled (`CompileLedger`), what every
step of one run shares (`SearchContext`), one batch size's inputs (`AtSize`) and
`BudgetExceeded`.

In-container module: standard library only.

The search's steps (candidates.py, default_search.py, final_pick.py) and its driver
(search.py) all use these, so they sit below all of them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cellbench.tune import spaces

__all__ = [
    "TuneOptions",
    "Entry",
    "Stats",
    "BudgetExceeded",
    "BackendLike",
    "CompileLedger",
    "SearchContext",
    "AtSize",
    "table_key",
]


class BudgetExceeded(RuntimeError):
    """The run's time budget ran out (only with TuneOptions.time_budget_s)."""


@dataclass
class TuneOptions:
    """Knobs of a tuning run (defaults suit a GPU; the CLI shrinks them on CPU)."""

    mode: str = "default"
    max_configs: int | None = None  # cap on configs considered per batch size
    seed: int = 0
    on_gpu: bool = True
    rotate: int = 4  # input sets the timed graph rotates over
    graph_calls: int = 10
    repeats: int = 20  # exhaustive and final side-by-side repeats
    halving_repeats: tuple[int, ...] = (3, 7, 15)
    eta: int = 3  # successive halving keeps 1/eta each round
    finalists: int = 4
    # default mode: distinct kernels newly compiled at the first batch size of a kernel
    # specialisation / at each later one (seeds and local-search moves included); None = no
    # limit. 12 later, not 8, from run 25 (H200, fp8): with 8 the local search at M=256 ran
    # out of new kernels before trying 3 stages around its best tile, and the pick re-timed
    # 1.4% slower than exhaustive's. Replayed on runs 21, 22 and 25's fp8 exhaustive logs
    # (8 seeds each), 12 brings the worst M<=256 ratio to 1.0056 (1.0117 with 8) and M=4096's
    # worst from 1.033 to 1.0008, for 12-19 more timings over the six batch sizes
    # (benchmarks/results/search_replay_2026-12-03_compile-budget.txt).
    compile_budget: tuple[int, int] | None = (32, 12)
    round0_max: int = 28  # configs timed in round 0 (compiled ones cost GPU time only)
    reuse_ranked: int = 6  # best-ranked configs of the previous batch size re-timed (no compile)
    local_rounds: int = 3  # rounds of one-step moves around the best two
    moves_per_round: int = 8
    warm_start: int = 4  # finalists of the previous batch size to seed the next
    # default mode: a batch size more than this many doublings above the one tuned before it
    # (or the first one) searches on its own: the first budget above, seeds from the seed
    # table's entries nearest it (`prior_seeds` of them) and the previous pick only, and
    # nothing re-timed for free from the far size (see default_search.py)
    near_log2: float = 1.0
    prior_seeds: int = 3
    abandon_factor: float = 1.5  # stop timing a config whose first replay is this much slower
    check_correctness: bool = True
    compile_workers: int = 0  # >0: warm up (compile) candidates in worker processes
    time_budget_s: float | None = None  # stop (leaving later batch sizes untuned) past this
    seed_table: dict[int, dict[str, int]] | None = None  # e.g. vLLM's shipped configs


@dataclass
class Entry:
    """The chosen config for one batch size and what was measured about it."""

    m: int
    config: dict[str, int]
    time_us: float
    spread: float
    samples_us: list[float]
    method: str
    candidates: int
    ties: list[str] = field(default_factory=list)
    error: float | None = None
    new_compiles: int = 0  # distinct kernels first compiled at this batch size
    timed: int = 0  # configs timed at this batch size (reused log records not counted)
    tune_wall_s: float = 0.0  # wall seconds spent on this batch size

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "config_name": spaces.describe(self.config),
            "time_us": self.time_us,
            "spread": self.spread,
            "samples_us": self.samples_us,
            "timing_method": self.method,
            "candidates_considered": self.candidates,
            "tied_with": self.ties,
            "error_vs_reference": self.error,
            "new_compiles": self.new_compiles,
            "tune_wall_s": self.tune_wall_s,
        }


@dataclass
class Stats:
    """Counts and seconds spent (CPU seconds include compile workers)."""

    timed: int = 0
    reused: int = 0
    pruned: int = 0
    failed: int = 0
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    compile_cpu_s: float = 0.0
    compiled: int = 0  # distinct kernels compiled (config x M-dependent specialisation)
    setup_s: float = 0.0  # weights, compile workers' start, ceilings: before the first timing
    compile_wait_s: float = 0.0  # the GPU loop waiting for compile workers

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BackendLike:  # documentation of what `Tuner` needs from a backend (see backends.py)
    """make_problem(m, seed) -> problem; call(problem, config) -> closure running the fused
    call; output(problem, config) -> tensor; reference(problem) -> tensor; error_bound: float."""


def table_key(options: TuneOptions, m: int) -> str | None:
    """The key of the seed table's config vLLM would take at m (its nearest entry), if any."""
    table = options.seed_table
    if not table:
        return None
    return spaces.config_key(table[min(table, key=lambda k: (abs(k - m), k))])


class CompileLedger:
    """Which kernels this run compiled: a config compiled at one batch size serves the others
    with the same M-dependent specialisation (`spec`), and the compile budget counts only
    kernels new to the run."""

    def __init__(self, backend: Any):
        self.backend = backend
        # (M-dependent specialisation, config key) already compiled in this run
        self.compiled: set[tuple[tuple[Any, ...], str]] = set()
        self.new_compiles: dict[int, int] = {}
        self.class_first: dict[tuple[Any, ...], int] = {}

    def spec(self, m: int) -> tuple[Any, ...]:
        """The part of the kernel's specialisation that depends on M: Triton specialises integer
        arguments on ==1 and divisibility by 16 (the row count is M x top-k), plus the
        backend's own batch-size-dependent choices (the builtin kernel's path, TMA weight
        tiles and chaining: a kernel compiled at M=16 does not serve M=64 where they differ)."""
        topk = int(getattr(getattr(self.backend, "shape", None), "topk", 1) or 1)
        rows = m * topk
        own = getattr(self.backend, "m_specialisation", None)
        return (rows == 1, rows % 16 == 0, *(own(m) if own else ()))

    def stand_in_m(self, m: int) -> int:
        """The smallest batch size whose kernels are m's (same `spec`): where compile workers
        run a config to compile it (vLLM's kernel has no compile-only entry), they run it
        there. At m itself their runs shared the GPU with the timings: on an H100 (fp8, 18
        sizes) the first configs timed at each M >= 1024 measured 7-13% slow, and one was
        the previous size's pick (M=1024: 342.5 us in round 0, 302.9 us re-timed), so the
        local search went round another tile (1.028x exhaustive's pick); 12 workers at
        M=16384 also ran the GPU out of memory."""
        spec = self.spec(m)
        return next((x for x in range(1, min(m, 64)) if self.spec(x) == spec), m)

    def is_compiled(self, m: int, key: str) -> bool:
        return (self.spec(m), key) in self.compiled

    def note(self, m: int, key: str) -> None:
        """Count config `key` as compiled at m (new at m if its kernel was not yet)."""
        k = (self.spec(m), key)
        if k not in self.compiled:
            self.compiled.add(k)
            self.new_compiles[m] = self.new_compiles.get(m, 0) + 1

    def new_at(self, m: int) -> int:
        """Kernels first compiled at batch size m."""
        return self.new_compiles.get(m, 0)

    def first_of_spec(self, m: int) -> bool:
        """Whether m is the first batch size asked about with its specialisation (nothing
        compiled for it can be reused yet); the first asked is remembered."""
        spec = self.spec(m)
        self.class_first.setdefault(spec, m)
        return self.class_first[spec] == m


@dataclass
class SearchContext:
    """What every step of one tuning run shares: the backend, the space's pruning inputs
    (n, k: per-rank intermediate size and hidden size; operand_bytes: 2 or 1; limits), the
    knobs, the tuning log, the compile workers (or None), the counters, the compile ledger,
    the keys of configs that failed (never tried again) and the run's start (its clock for
    the time budget)."""

    backend: Any
    n: int
    k: int
    operand_bytes: int
    limits: spaces.HardwareLimits
    opt: TuneOptions
    log: Any  # artifacts.TuningLog
    pool: Any = None
    progress: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))
    stats: Stats = field(default_factory=Stats)
    ledger: CompileLedger = field(init=False)
    failed: set[str] = field(init=False)
    t_start: float = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = CompileLedger(self.backend)
        self.failed = set(self.log.failed_keys())
        self.t_start = time.perf_counter()

    def over_budget(self) -> bool:
        b = self.opt.time_budget_s
        return b is not None and time.perf_counter() - self.t_start > b


@dataclass
class AtSize:
    """One batch size's inputs: the problems the timed graph rotates over, the reference
    output (or None) and whether candidates are checked against it (at the first batch size,
    where asked)."""

    m: int
    problems: list[Any]
    ref: Any
    check: bool
