"""The search's shared types: its knobs (`TuneOptions`), what it keeps per batch size
(`Entry`) and over the run (`Stats`), and `BudgetExceeded`.

In-container module: standard library only.

Split from search.py: the search's parts (candidates.py, default_search.py,
final_pick.py) and the search itself all use these, so they sit below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cellbench.tune import spaces

__all__ = ["TuneOptions", "Entry", "Stats", "BudgetExceeded", "BackendLike"]


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
