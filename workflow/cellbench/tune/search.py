"""Config search for one shape over a list of batch sizes.

In-container module: stdlib + torch (+ triton through the backend).

Modes:
- exhaustive: every config of the space that survives pruning is timed (configs whose first
  graph replay is far slower than the best so far stop there: their single sample is kept);
  the best `finalists` are then re-timed side by side, interleaved, and picked as below.
- default: a fixed budget of newly compiled kernels per batch size (compiling, not timing,
  is what costs: ~0.7 CPU-s a kernel on an H200 host). Round 0 times the warm-start seeds
  (previous batch size's finalists, the nearest entry of a given table such as vLLM's shipped
  file), the best-ranked configs of the previous batch size that are already compiled, and
  new configs chosen by structure (one per BM/BN/BK/warps tile, BM near the rows an expert
  gets, warps sized for the tile, stages that fit shared memory), with few repeats. Local
  search then tries one-step moves around the best two (one key, or a block size together
  with the warps; nearest steps of every kind first) while the budget lasts; successive
  halving re-times the leaders with more repeats, and the finalists (plus the table's config)
  are re-timed side by side, interleaved, and picked by median, where differences inside the
  measured spread count as ties, won by the table's config, else by the lowest median; a
  tie of the table's config with a finalist that measured faster is timed again, the two
  side by side with twice the repeats, and the median of all their samples decides. A
  kernel compiled at one batch size is reused at the other batch sizes with the same
  specialisation. A batch size more than a doubling above the one tuned before it searches
  on its own, as the first one does (the first budget, the seed table's nearest entries as
  its prior, nothing carried from the far size but its pick): see `DefaultSearch.far`.
  With compile workers, the search also queues guesses: its seeds'
  neighbours (the likely moves) and, from round 0's ranking on, the next batch size's likely
  round 0; the workers take a guess only when no needed kernel waits (see CompilePool). On
  the builtin kernel's few-token path the default mode screens every distinct kernel, as
  exhaustive does (see `SCREEN_ALL_PATHS`).

Every candidate, including pruned ones and failures, goes to the tuning log; a killed run
reads the log back and does not re-time what it already timed.

The search's parts live beside it as objects the driver (`Tuner`) is given: search_types.py
(options, entries, stats, the compile ledger and the context every step shares),
candidates.py (one candidate: pruning, check, timing; the screen over a list), default_search.py
(the default mode's rounds and the warm start between batch sizes) and final_pick.py (the
side-by-side final and the pick). `build_tuner` puts them together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.artifacts import TuningLog
from cellbench.tune.candidates import CandidateSteps, commonest_reason
from cellbench.tune.default_search import DefaultSearch
from cellbench.tune.final_pick import FinalPick
from cellbench.tune.search_types import (
    AtSize,
    BudgetExceeded,
    Entry,
    SearchContext,
    Stats,
    TuneOptions,
    table_key,
)

__all__ = [
    "TuneOptions",
    "Entry",
    "Stats",
    "Tuner",
    "BudgetExceeded",
    "build_tuner",
    "commonest_reason",
]

# Kernel paths on which the default mode times every distinct kernel, as exhaustive does.
# The few-token path ignores BLOCK_SIZE_M and GROUP_SIZE_M, so vLLM's CUDA space shrinks to
# 86 kernels there, and its time depends on num_stages more than the structured search (one
# stage count per tile) explores. On the H200 (benchmarks/results/tuner_h200_2026-12-03_*):
# the structured default picked a config 5.5% slower than exhaustive's at M=1 (run 10);
# screening all 86 matched exhaustive (0.997-1.006 at M=1/2, runs 11-12). It cost 11.6 s
# only while the compile workers started at the first warm-up; with them started at pool
# creation, screening all 86 takes 3.8 s, less than timing every tile and then every stage
# count of the best four tiles (36 kernels in two compile waves: 4.6 s, run 13).
SCREEN_ALL_PATHS = ("decode",)


class Tuner:
    """Tunes one shape on one device: the driver over the batch sizes, given its steps.

    steps: one candidate's steps and the screen (candidates.py); search: the default mode's
    rounds (default_search.py); final: the side-by-side final and the pick (final_pick.py).
    All share `ctx` (search_types.SearchContext). `build_tuner` makes the usual set.
    """

    def __init__(
        self, ctx: SearchContext, steps: CandidateSteps, search: DefaultSearch, final: FinalPick
    ):
        self.ctx = ctx
        self.steps = steps
        self.search = search
        self.final = final
        pool = ctx.pool
        if pool is not None and not getattr(pool, "compile_only", True):
            pool.warm_m = ctx.ledger.stand_in_m  # workers that run kernels run small ones
        self.first_m: int | None = None
        self.last_m: int | None = None
        self.skipped: list[int] = []

    @property
    def stats(self) -> Stats:
        return self.ctx.stats

    def _at(self, m: int) -> AtSize:
        """m's problems, and its reference where candidates are checked (the first size)."""
        ctx = self.ctx
        problems = [
            ctx.backend.make_problem(m, ctx.opt.seed * 1000 + i) for i in range(ctx.opt.rotate)
        ]
        check = m == self.first_m and ctx.opt.check_correctness
        ref = ctx.backend.reference(problems[0]) if check else None
        return AtSize(m, problems, ref, check)

    def _screen_all(self, at: AtSize, cands: list[tuple[str, dict[str, int]]]) -> Entry:
        """Every candidate timed (exhaustive mode, or a path that screens all), then the
        leaders re-timed side by side and the pick."""
        opt, search, m = self.ctx.opt, self.search, at.m
        if opt.max_configs:
            cands = cands[: opt.max_configs]
        stage = "exhaustive" if opt.mode == "exhaustive" else "screen-all"
        ranked = self.steps.screen(
            at, cands, stage, opt.repeats, True,
            queue_behind=lambda: search.prefetch_next(m, search.finalists_prev,
                                                      search.ranked_prev),
        )  # fmt: skip
        if not ranked:
            raise RuntimeError(self.steps.nothing_left(m))
        # The screen times configs one after another, so clock and power drift between
        # them ranks too: the leaders are re-timed side by side, interleaved, before the
        # pick (at M=1 on the H200 the top four of 86 lie within ~1.3%, run 14).
        finalists = [(r[2], r[3]) for r in ranked[: opt.finalists]]
        tk = table_key(opt, m)
        if tk is not None and any(r[2] == tk for r in ranked[opt.finalists :]):
            finalists.append(next((r[2], r[3]) for r in ranked if r[2] == tk))
        return self.final.final(m, finalists, at.problems, len(cands))

    def tune_one(self, m: int) -> Entry:
        """Tune batch size m; returns the chosen entry (raises if every config failed)."""
        ctx = self.ctx
        t0 = time.perf_counter()
        c0 = (ctx.stats.timed, ctx.stats.pruned, ctx.stats.failed)
        if self.first_m is None:
            self.first_m = m
        self.search.prev_of.setdefault(m, self.last_m)
        at = self._at(m)
        cands = self.steps.candidates(m)
        path_of = getattr(ctx.backend, "kernel_path", None)
        screen_all = path_of is not None and path_of(at.problems[0]) in SCREEN_ALL_PATHS
        if ctx.opt.mode == "exhaustive" or screen_all:
            entry = self._screen_all(at, cands)
        else:
            entry = self.search.run(at, cands)
        err = None
        if at.check:
            rec = ctx.log.lookup(m, spaces.config_key(entry.config), "check")
            err = rec.get("error") if rec else None
        entry.error = err
        entry.new_compiles = ctx.ledger.new_at(m)
        entry.tune_wall_s = time.perf_counter() - t0
        ctx.stats.compiled = len(ctx.ledger.compiled)
        c1 = (ctx.stats.timed, ctx.stats.pruned, ctx.stats.failed)
        entry.timed = c1[0] - c0[0]
        self.last_m = m
        ctx.progress(
            f"[tune] M={m}: {c1[0] - c0[0]} timed, {c1[1] - c0[1]} pruned, "
            f"{c1[2] - c0[2]} failed of {len(cands)} candidates; best {entry.time_us:.2f} us "
            f"({spaces.describe(entry.config)}); {entry.new_compiles} new kernels; "
            f"{entry.tune_wall_s:.1f} s"
        )
        return entry

    def tune(self, batch_sizes: Sequence[int]) -> dict[int, Entry]:
        """Tune every batch size in increasing order (warm starts go from small to large).

        With a time budget, batch sizes not finished in time are left out and listed in
        `self.skipped`.
        """
        out: dict[int, Entry] = {}
        ms = sorted(batch_sizes)
        self.search.next_m = dict(zip(ms[:-1], ms[1:], strict=True))
        self.search.prev_of.update(zip(ms[1:], ms[:-1], strict=True))
        for i, m in enumerate(ms):
            try:
                out[m] = self.tune_one(m)
            except BudgetExceeded as e:
                self.skipped = ms[i:]
                self.ctx.progress(f"[tune] {e}; not tuned: {self.skipped}")
                break
        return out


def build_tuner(
    backend: Any,
    space: Sequence[dict[str, int]],
    *,
    n: int,
    k: int,
    operand_bytes: int,
    limits: spaces.HardwareLimits,
    options: TuneOptions,
    log: TuningLog,
    compile_pool: Any = None,
    progress: Callable[[str], None] | None = None,
    candidate_steps: Callable[[SearchContext, Sequence[dict[str, int]]], CandidateSteps] = (
        CandidateSteps
    ),
    final_pick: Callable[[SearchContext, CandidateSteps], FinalPick] = FinalPick,
) -> Tuner:
    """A `Tuner` for one shape on one device, with its steps.

    backend: see backends.py (builtin or vllm). space: candidate configs (spaces.cuda_space()
    etc.). n, k: per-rank intermediate size and hidden size (for pruning); operand_bytes: 2
    or 1. candidate_steps and final_pick make those steps (a replay of recorded timings
    passes its own)."""
    ctx = SearchContext(backend, n, k, operand_bytes, limits, options, log, compile_pool)
    if progress is not None:
        ctx.progress = progress
    steps = candidate_steps(ctx, space)
    final = final_pick(ctx, steps)
    return Tuner(ctx, steps, DefaultSearch(ctx, steps, final), final)
