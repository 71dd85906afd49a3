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
  its prior, nothing carried from the far size but its pick): see `DefaultSearch._far`.
  With compile workers, the search also queues guesses: its seeds'
  neighbours (the likely moves) and, from round 0's ranking on, the next batch size's likely
  round 0; the workers take a guess only when no needed kernel waits (see CompilePool). On
  the builtin kernel's few-token path the default mode screens every distinct kernel, as
  exhaustive does (see `SCREEN_ALL_PATHS`).

Every candidate, including pruned ones and failures, goes to the tuning log; a killed run
reads the log back and does not re-time what it already timed.

The search's parts live beside it: search_types.py (options, entries, stats),
candidates.py (one candidate: pruning, check, timing, compile accounting), default_search.py
(the default mode's rounds) and final_pick.py (the side-by-side final and the pick).
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.artifacts import TuningLog
from cellbench.tune.candidates import CandidateSteps
from cellbench.tune.default_search import DefaultSearch
from cellbench.tune.final_pick import FinalPick
from cellbench.tune.search_types import BudgetExceeded, Entry, Stats, TuneOptions
from cellbench.tune.timing import Timing

__all__ = ["TuneOptions", "Entry", "Stats", "Tuner", "BudgetExceeded"]

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


def commonest_reason(reasons: Iterable[str]) -> tuple[int, int, str]:
    """(count, total, example) of the commonest reason; reasons that differ only in their
    numbers (sizes, errors, line numbers) count as one, and the example is the first seen."""
    groups: Counter[str] = Counter()
    example: dict[str, str] = {}
    total = 0
    for r in reasons:
        line = (r.strip().splitlines() or [""])[0][:300]
        key = _NUMBER.sub("#", line)
        groups[key] += 1
        example.setdefault(key, line)
        total += 1
    if not total:
        return 0, 0, ""
    key, n = groups.most_common(1)[0]
    return n, total, example[key]


_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


class Tuner(CandidateSteps, DefaultSearch, FinalPick):
    """Tunes one shape on one device.

    backend: see backends.py (builtin or vllm).
    space: candidate configs (spaces.cuda_space() etc.).
    n, k: per-rank intermediate size and hidden size (for pruning); operand_bytes: 2 or 1.

    Its steps are mixed in: one candidate's (candidates.py), the default mode's search
    (default_search.py) and the side-by-side final and pick (final_pick.py).
    """

    def __init__(
        self,
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
    ):
        self.backend = backend
        self.space = list(space)
        self.n, self.k, self.operand_bytes = n, k, operand_bytes
        self.limits = limits
        self.opt = options
        self.log = log
        self.pool = compile_pool
        if compile_pool is not None and not getattr(compile_pool, "compile_only", True):
            compile_pool.warm_m = self._stand_in_m  # workers that run kernels run small ones
        self.progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
        self.stats = Stats()
        self.failed: set[str] = set(log.failed_keys())
        self.first_m: int | None = None
        rng = random.Random(options.seed)
        self.order = list(range(len(self.space)))
        rng.shuffle(self.order)  # one random order for all batch sizes
        self.finalists_prev: list[str] = []
        self.ranked_prev: list[str] = []
        # (M-dependent specialisation, config key) already compiled in this run
        self.compiled: set[tuple[tuple[Any, ...], str]] = set()
        self.new_compiles: dict[int, int] = {}
        self.class_first: dict[tuple[Any, ...], int] = {}
        self.t_start = time.perf_counter()
        self.skipped: list[int] = []
        self.next_m: dict[int, int] = {}  # batch size -> the one tuned after it
        self.prev_of: dict[int, int | None] = {}  # batch size -> the one tuned before it
        self.last_m: int | None = None

    def _over_budget(self) -> bool:
        b = self.opt.time_budget_s
        return b is not None and time.perf_counter() - self.t_start > b

    def _screen(
        self,
        m: int,
        cands: list[tuple[str, dict[str, int]]],
        problems: list[Any],
        ref: Any,
        stage: str,
        repeats: int,
        abandon: bool,
        queue_behind: Callable[[], None] | None = None,
    ) -> list[tuple[float, int, str, dict[str, int], Timing]]:
        """Check (at the first batch size) and time `cands`; returns sorted (time, order, ...).
        With compile workers, `queue_behind` queues speculative warm-ups behind `cands`'."""
        if self.pool is not None:  # the workers compile ahead of the GPU (only new kernels)
            self.pool.prefetch(m, [c for k, c in cands if not self._is_compiled(m, k)])
            if queue_behind is not None:
                queue_behind()
        results = []
        best = math.inf
        for i, (key, cfg) in enumerate(cands):
            if key in self.failed:
                continue
            if self._over_budget():
                raise BudgetExceeded(f"time budget {self.opt.time_budget_s} s spent at M={m}")
            if m == self.first_m and self.opt.check_correctness:
                self._pool_wait(m, key, cfg)  # let the workers compile it, not this process
                ok, _ = self._check(m, cfg, key, problems, ref)
                if not ok:
                    continue
            limit = best * self.opt.abandon_factor if abandon and math.isfinite(best) else None
            t = self._time(m, cfg, key, stage, problems, repeats, limit)
            if t is None:
                continue
            best = min(best, t.median_us)
            results.append((t.median_us, i, key, cfg, t))
            if (i + 1) % 100 == 0:  # long stages: show they are moving
                self.progress(
                    f"[tune]   M={m} {stage}: {i + 1}/{len(cands)} configs, best {best:.2f} us, "
                    f"{time.perf_counter() - self.t_start:.0f} s since start"
                )
        results.sort(key=lambda r: (r[0], r[1]))
        return results

    def _nothing_left(self, m: int) -> str:
        """Why batch size m has no config left: the commonest failure (its message and how
        many configs hit it), so the terminal says more than "every candidate failed"."""
        failed = self.log.reasons("failed")
        pruned = self.log.reasons("pruned", m)
        head = (
            f"M={m}: every candidate config failed or was pruned ({len(failed)} configs failed "
            f"so far, {len(pruned)} pruned at M={m})"
        )
        for what, reasons in (("failure", failed), ("pruning reason", pruned)):
            if reasons:
                n, total, example = commonest_reason(reasons.values())
                return f"{head}; commonest {what}, {n} of {total} configs: {example}"
        return f"{head}; the space held no config to try"

    def tune_one(self, m: int) -> Entry:
        """Tune batch size m; returns the chosen entry (raises if every config failed)."""
        t0 = time.perf_counter()
        c0 = (self.stats.timed, self.stats.pruned, self.stats.failed)
        if self.first_m is None:
            self.first_m = m
        self.prev_of.setdefault(m, self.last_m)
        problems = [
            self.backend.make_problem(m, self.opt.seed * 1000 + i) for i in range(self.opt.rotate)
        ]
        ref = None
        if m == self.first_m and self.opt.check_correctness:
            ref = self.backend.reference(problems[0])
        cands = self._candidates(m)
        path_of = getattr(self.backend, "kernel_path", None)
        screen_all = path_of is not None and path_of(problems[0]) in SCREEN_ALL_PATHS
        if self.opt.mode == "exhaustive" or screen_all:
            if self.opt.max_configs:
                cands = cands[: self.opt.max_configs]
            stage = "exhaustive" if self.opt.mode == "exhaustive" else "screen-all"
            ranked = self._screen(
                m, cands, problems, ref, stage, self.opt.repeats, True,
                queue_behind=lambda: self._prefetch_next(m, self.finalists_prev, self.ranked_prev),
            )  # fmt: skip
            if not ranked:
                raise RuntimeError(self._nothing_left(m))
            # The screen times configs one after another, so clock and power drift between
            # them ranks too: the leaders are re-timed side by side, interleaved, before the
            # pick (at M=1 on the H200 the top four of 86 lie within ~1.3%, run 14).
            finalists = [(r[2], r[3]) for r in ranked[: self.opt.finalists]]
            tk = self._table_key(m)
            if tk is not None and any(r[2] == tk for r in ranked[self.opt.finalists :]):
                finalists.append(next((r[2], r[3]) for r in ranked if r[2] == tk))
            entry = self._final(m, finalists, problems, len(cands))
        else:
            entry = self._default_search(m, cands, problems, ref)
        err = None
        if m == self.first_m and self.opt.check_correctness:
            rec = self.log.lookup(m, spaces.config_key(entry.config), "check")
            err = rec.get("error") if rec else None
        entry.error = err
        entry.new_compiles = self.new_compiles.get(m, 0)
        entry.tune_wall_s = time.perf_counter() - t0
        self.stats.compiled = len(self.compiled)
        c1 = (self.stats.timed, self.stats.pruned, self.stats.failed)
        entry.timed = c1[0] - c0[0]
        self.last_m = m
        self.progress(
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
        self.next_m = dict(zip(ms[:-1], ms[1:], strict=True))
        self.prev_of.update(zip(ms[1:], ms[:-1], strict=True))
        for i, m in enumerate(ms):
            try:
                out[m] = self.tune_one(m)
            except BudgetExceeded as e:
                self.skipped = ms[i:]
                self.progress(f"[tune] {e}; not tuned: {self.skipped}")
                break
        return out
