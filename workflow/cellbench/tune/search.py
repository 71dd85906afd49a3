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
  specialisation. With compile workers, the search also queues guesses: its seeds'
  neighbours (the likely moves) and, from round 0's ranking on, the next batch size's likely
  round 0; the workers take a guess only when no needed kernel waits (see CompilePool). On
  the builtin kernel's few-token path the default mode screens every distinct kernel, as
  exhaustive does (see `SCREEN_ALL_PATHS`).

Every candidate, including pruned ones and failures, goes to the tuning log; a killed run
reads the log back and does not re-time what it already timed.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.artifacts import TuningLog
from cellbench.tune.timing import Timing, time_calls, time_side_by_side

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


def rel_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float64 (nan/inf -> inf)."""
    import torch

    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if not torch.isfinite(o).all():
        return math.inf
    den = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(o - r))
    return num / den if den > 0 else num


class Tuner:
    """Tunes one shape on one device.

    backend: see backends.py (builtin or vllm).
    space: candidate configs (spaces.cuda_space() etc.).
    n, k: per-rank intermediate size and hidden size (for pruning); operand_bytes: 2 or 1.
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

    def _over_budget(self) -> bool:
        b = self.opt.time_budget_s
        return b is not None and time.perf_counter() - self.t_start > b

    # -- one candidate ----------------------------------------------------------------------
    def _check(self, m: int, cfg: dict[str, int], key: str, problems: list[Any], ref: Any):
        """Correctness against the reference at the first batch size; False = failed."""
        prev = self.log.lookup(m, key, "check")
        if prev is not None:
            return prev["status"] == "checked", prev.get("error")
        t0 = time.perf_counter()
        try:
            out = self.backend.output(problems[0], cfg)
            err = rel_error(out, ref)
        except Exception as e:  # noqa: BLE001 - any compile/launch failure disqualifies
            self._fail(m, cfg, key, "check", f"{type(e).__name__}: {e}")
            return False, None
        finally:
            self._note_compiled(m, key)
            self.stats.gpu_s += time.perf_counter() - t0 if self.opt.on_gpu else 0.0
        bound = self.backend.error_bound
        ok = err <= bound
        rec = {
            "m": m,
            "key": key,
            "config": cfg,
            "stage": "check",
            "status": "checked" if ok else "failed",
            "error": err if math.isfinite(err) else None,
            "bound": bound,
        }
        if not ok:
            rec["reason"] = f"error {err:.3g} > bound {bound:.3g} vs torch reference"
            self.failed.add(key)
            self.stats.failed += 1
        self.log.append(rec)
        return ok, err

    def _fail(self, m: int, cfg: dict[str, int], key: str, stage: str, why: str) -> None:
        self.failed.add(key)
        self.stats.failed += 1
        self.log.append(
            {"m": m, "key": key, "config": cfg, "stage": stage, "status": "failed", "reason": why}
        )

    def _time(
        self,
        m: int,
        cfg: dict[str, int],
        key: str,
        stage: str,
        problems: list[Any],
        repeats: int,
        abandon_above_us: float | None,
    ) -> Timing | None:
        prev = self.log.lookup(m, key, stage)
        if prev is not None:
            self.stats.reused += 1
            if prev["status"] != "timed":
                return None
            return Timing(
                prev["time_us"],
                prev.get("samples_us", []),
                prev.get("method", ""),
                prev.get("abandoned", False),
                0.0,
            )
        self._pool_wait(m, key, cfg)
        calls = [self.backend.call(p, cfg) for p in problems]
        try:
            t = time_calls(
                calls,
                on_gpu=self.opt.on_gpu,
                graph_calls=self.opt.graph_calls,
                repeats=repeats,
                abandon_above_us=abandon_above_us,
            )
        except Exception as e:  # noqa: BLE001 - compile errors, out of resources, ...
            self._fail(m, cfg, key, stage, f"{type(e).__name__}: {str(e)[:300]}")
            return None
        finally:
            self._note_compiled(m, key)
        self._record_timed(m, key, cfg, stage, t)
        return t

    def _record_timed(self, m: int, key: str, cfg: dict[str, int], stage: str, t: Timing):
        """Count a timing and write its log record (the record a resumed run reads back)."""
        self.stats.timed += 1
        self.stats.gpu_s += t.wall_s if self.opt.on_gpu else 0.0
        self.log.append(
            {
                "m": m,
                "key": key,
                "config": cfg,
                "stage": stage,
                "status": "timed",
                "time_us": t.median_us,
                "spread": t.spread,
                "samples_us": [round(s, 4) for s in t.samples_us],
                "method": t.method,
                "abandoned": t.abandoned,
                **(
                    {"phases_ms": {k: round(v * 1e3, 2) for k, v in t.phases_s.items()}}
                    if t.phases_s
                    else {}
                ),
            }
        )

    def _pool_wait(self, m: int, key: str, cfg: dict[str, int]) -> None:
        """Wait for a compile worker's warm-up of a kernel not compiled yet in this run."""
        if self.pool is not None and not self._is_compiled(m, key):
            self.pool.wait(m, cfg)

    # -- one batch size ---------------------------------------------------------------------
    def _candidates(self, m: int, quiet: bool = False) -> list[tuple[str, dict[str, int]]]:
        """Configs of the space that survive pruning at m, one per distinct kernel; pruned ones
        are logged and counted unless `quiet` (a look ahead at the next batch size)."""
        kept: list[tuple[str, dict[str, int]]] = []
        identity = getattr(self.backend, "kernel_identity", None)
        first_of: dict[str, str] = {}  # kernel identity -> first config key kept
        for idx in self.order:
            cfg = self.space[idx]
            key = spaces.config_key(cfg)
            why = spaces.prune_reason(
                cfg, m=m, n=self.n, k=self.k, operand_bytes=self.operand_bytes, limits=self.limits
            )
            if why is None and identity is not None and key not in self.failed:
                kid = identity(m, cfg)
                if kid in first_of:  # e.g. the few-token path ignores BLOCK_SIZE_M
                    why = f"same kernel at M={m} as {first_of[kid]} (keys this path ignores)"
                else:
                    first_of[kid] = key
            if why is not None and quiet:
                continue
            if why is not None:
                self.stats.pruned += 1
                self.log.append(
                    {
                        "m": m,
                        "key": key,
                        "config": cfg,
                        "stage": "prune",
                        "status": "pruned",
                        "reason": why,
                    }
                )
            elif key not in self.failed:
                kept.append((key, cfg))
        return kept

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

    def _final(
        self,
        m: int,
        finalists: list[tuple[str, dict[str, int]]],
        problems: list[Any],
        n_cands: int,
    ) -> Entry:
        """The finalists re-timed side by side, a tie with the seed table's config settled
        (`_settle_tie`), and the pick (`_pick`)."""
        final = self._side_by_side(m, finalists, problems, self.opt.repeats, "final")
        final, settled = self._settle_tie(m, final, problems)
        return self._pick(m, final, n_cands, settled)

    def _side_by_side(
        self,
        m: int,
        configs: list[tuple[str, dict[str, int]]],
        problems: list[Any],
        repeats: int,
        stage: str,
    ) -> list[tuple[str, dict[str, int], Timing]]:
        """configs timed interleaved, `repeats` each (reused from the log when all are there)."""
        prev = [self.log.lookup(m, key, stage) for key, _ in configs]
        if all(p is not None and p["status"] == "timed" for p in prev):
            self.stats.reused += len(prev)
            return [
                (key, cfg, Timing(p["time_us"], p["samples_us"], p.get("method", "")))
                for (key, cfg), p in zip(configs, prev, strict=True)
            ]
        call_sets = [[self.backend.call(p, cfg) for p in problems] for _, cfg in configs]
        timings = time_side_by_side(
            call_sets, on_gpu=self.opt.on_gpu, graph_calls=self.opt.graph_calls, repeats=repeats
        )
        out = []
        for (key, cfg), t in zip(configs, timings, strict=True):
            self._record_timed(m, key, cfg, stage, t)
            out.append((key, cfg, t))
        return out

    @staticmethod
    def _noise(final: list[tuple[str, dict[str, int], Timing]]) -> float:
        """The relative difference below which two of these medians tie."""
        return max(max((t.spread for _, _, t in final), default=0.0), 0.005)

    def _settle_tie(
        self, m: int, final: list[tuple[str, dict[str, int], Timing]], problems: list[Any]
    ) -> tuple[list[tuple[str, dict[str, int], Timing]], bool]:
        """Where the seed table's config ties (within the final's noise) with a finalist that
        measured faster, time the two again side by side, twice as long, and let the median
        of all their samples decide: on the H200 the tie rule alone kept vLLM's config at
        fp8 M=4096 in runs 16, 21 and 22, and it re-timed 0.8-0.9% slower than exhaustive's
        pick each time (spreads 0.4-0.8%). Returns (final, whether the tie was re-timed)."""
        tk = self._table_key(m)
        table = next((x for x in final if x[0] == tk), None)
        best = min(final, key=lambda x: x[2].median_us)
        if table is None or best[0] == tk:
            return final, False
        if table[2].median_us > best[2].median_us * (1 + self._noise(final)):
            return final, False  # not a tie
        again = self._side_by_side(m, [best[:2], table[:2]], problems, 2 * self.opt.repeats,
                                   "tiebreak")  # fmt: skip
        merged = {}
        for key, cfg, t in again:
            before = next(x[2] for x in final if x[0] == key)
            samples = list(before.samples_us) + list(t.samples_us)
            merged[key] = (key, cfg, Timing(statistics.median(samples), samples, t.method))
        return [merged.get(x[0], x) for x in final], True

    def _pick(
        self,
        m: int,
        final: list[tuple[str, dict[str, int], Timing]],
        n_cands: int,
        tie_settled: bool = False,
    ) -> Entry:
        """Lowest median; configs within the measured spread of it tie, and the seed table's
        config wins a tie it is in (unless `_settle_tie` re-timed it), else the lowest
        median stands."""
        best_t = min(t.median_us for _, _, t in final)
        noise = self._noise(final)
        tied = [(i, key, cfg, t) for i, (key, cfg, t) in enumerate(final)]
        tied = [x for x in tied if x[3].median_us <= best_t * (1 + noise)]
        # The seed table's (vLLM's shipped) config wins a tie: the H200 run of 2026-12-02
        # picked a cheaper tied config at M=4096 that re-timed 1.8% slower than it. Otherwise
        # the lowest median: preferring the cheaper config (less shared memory) in a tie
        # passed over a BLOCK_SIZE_N 128 config at M=1 in run 5, and the pick re-timed 1.1%
        # slower than exhaustive's (also BLOCK_SIZE_N 128).
        tk = None if tie_settled else self._table_key(m)
        tied.sort(key=lambda x: (x[1] != tk, x[3].median_us, x[0]))
        _, key, cfg, t = tied[0]
        return Entry(
            m,
            cfg,
            t.median_us,
            t.spread,
            t.samples_us,
            t.method,
            n_cands,
            [spaces.describe(x[2]) for x in tied[1:]],
        )

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
        self.progress(
            f"[tune] M={m}: {c1[0] - c0[0]} timed, {c1[1] - c0[1]} pruned, "
            f"{c1[2] - c0[2]} failed of {len(cands)} candidates; best {entry.time_us:.2f} us "
            f"({spaces.describe(entry.config)}); {entry.new_compiles} new kernels; "
            f"{entry.tune_wall_s:.1f} s"
        )
        return entry

    @staticmethod
    def _tile(cfg: dict[str, int]) -> tuple[int, ...]:
        """The block shape and warp count: what matters most; GROUP_M and stages refine it."""
        return (cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"], cfg["num_warps"])

    # -- compile accounting -------------------------------------------------------------------
    def _spec(self, m: int) -> tuple[Any, ...]:
        """The part of the kernel's specialisation that depends on M: Triton specialises integer
        arguments on ==1 and divisibility by 16 (the row count is M x top-k), plus the
        backend's own batch-size-dependent choices (the builtin kernel's path, TMA weight
        tiles and chaining: a kernel compiled at M=16 does not serve M=64 where they differ)."""
        topk = int(getattr(getattr(self.backend, "shape", None), "topk", 1) or 1)
        rows = m * topk
        own = getattr(self.backend, "m_specialisation", None)
        return (rows == 1, rows % 16 == 0, *(own(m) if own else ()))

    def _is_compiled(self, m: int, key: str) -> bool:
        return (self._spec(m), key) in self.compiled

    def _note_compiled(self, m: int, key: str) -> None:
        k = (self._spec(m), key)
        if k not in self.compiled:
            self.compiled.add(k)
            self.new_compiles[m] = self.new_compiles.get(m, 0) + 1

    def _compile_budget(self, m: int) -> int | None:
        """New kernels allowed at batch size m: the larger budget at the first batch size of
        each M-dependent specialisation (nothing compiled for it can be reused yet)."""
        if self.opt.compile_budget is None:
            return None
        first, later = self.opt.compile_budget
        spec = self._spec(m)
        self.class_first.setdefault(spec, m)
        return first if self.class_first[spec] == m else later

    # -- structure ----------------------------------------------------------------------------
    def _bm_target(self, m: int) -> int:
        """Rows an expert gets on average (M x top-k / E), as a power of two in [16, 128]."""
        sh = getattr(self.backend, "shape", None)
        topk = int(getattr(sh, "topk", 1) or 1)
        e = int(getattr(sh, "num_experts", 1) or 1)
        rows = max(1, math.ceil(m * topk / e))
        return min(max(16, 1 << (rows - 1).bit_length()), 128)

    def _warps_for(self, cfg: dict[str, int], choices: list[int]) -> int:
        """Warps that keep the fp32 accumulator at 32-128 values per thread (fewer is cheaper)."""
        area = cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_N"]
        lanes = 64 if self.limits.platform == "rocm" else 32
        ok = [w for w in sorted(choices) if area // (lanes * w) <= 128]
        return ok[0] if ok else max(choices)

    def _structured(
        self, m: int, cands: list[tuple[str, dict[str, int]]], anchors: list[dict[str, int]]
    ) -> list[tuple[str, dict[str, int]]]:
        """Candidates in structural order: one representative per (BM, BN, BK, warps) tile with
        the stages that fit shared memory comfortably and a GROUP_M suited to M, tiles ranked
        by how close BM is to the rows an expert gets and BN/BK to the anchors' (the seeds),
        the warp count sized for the tile first."""
        if not cands:
            return []
        vals: dict[str, list[int]] = {}
        for _, c in cands:
            for kk, v in c.items():
                vals.setdefault(kk, [])
                if v not in vals[kk]:
                    vals[kk].append(v)
        bm_t = self._bm_target(m)
        smem = self.limits.smem_bytes
        group_pref = 1 if m <= 256 else 16
        by_tile: dict[tuple[int, ...], list[tuple[str, dict[str, int]]]] = {}
        for kc in cands:
            by_tile.setdefault(self._tile(kc[1]), []).append(kc)

        def rep(members: list[tuple[str, dict[str, int]]]) -> tuple[str, dict[str, int]]:
            def cost(kc: tuple[str, dict[str, int]]) -> tuple[float, ...]:
                c = kc[1]
                need = spaces.smem_lower_bound(c, self.operand_bytes)
                fits = smem is None or need <= 0.6 * smem
                st = c.get("num_stages", 2)
                return (
                    0 if fits else 1,
                    abs(st - 4) if smem is not None else 0,
                    0 if c["GROUP_SIZE_M"] == group_pref else 1,
                    abs(c.get("waves_per_eu", 0)),
                )

            return min(members, key=cost)

        def lg(a: int, b: int) -> float:
            return abs(math.log2(a) - math.log2(b))

        def score(tile: tuple[int, ...]) -> tuple[float, ...]:
            bm, bn, bk, w = tile
            cfg = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}
            d = lg(bm, bm_t)
            if anchors:
                d += 0.5 * min(
                    lg(bn, a["BLOCK_SIZE_N"]) + lg(bk, a["BLOCK_SIZE_K"]) for a in anchors
                )
            warps_off = 0 if w == self._warps_for(cfg, vals["num_warps"]) else 1
            return (warps_off, d, -bk, bn)

        tiles = sorted(by_tile, key=score)
        return [rep(by_tile[t]) for t in tiles]

    def _neighbours(
        self, cfg: dict[str, int], by_key: dict[str, dict[str, int]]
    ) -> list[tuple[str, dict[str, int]]]:
        """Configs one step from cfg, nearest steps of every kind first (round robin): stages
        +-1, warps x2 or /2, BK, BN or BM x2 or /2, another GROUP_M, then BN or BM and warps
        doubled or halved together (the same accumulator per thread: a wider tile that one
        key alone reaches only through a slower config), then stages +-2."""
        st = cfg.get("num_stages", 2)
        w = cfg["num_warps"]
        kinds: list[list[dict[str, int]]] = [
            [{"num_stages": st + 1}, {"num_stages": st - 1}],
            [{"num_warps": w * 2}, {"num_warps": w // 2}],
        ]
        for kk in ("BLOCK_SIZE_K", "BLOCK_SIZE_N", "BLOCK_SIZE_M"):
            kinds.append([{kk: cfg[kk] * 2}, {kk: cfg[kk] // 2}])
        kinds.append([{"GROUP_SIZE_M": g} for g in (1, 16, 32, 64, 4, 8)])
        for kk in ("BLOCK_SIZE_N", "BLOCK_SIZE_M"):
            kinds.append([{kk: cfg[kk] * 2, "num_warps": w * 2},
                          {kk: cfg[kk] // 2, "num_warps": w // 2}])  # fmt: skip
        kinds.append([{"num_stages": st + 2}, {"num_stages": st - 2}])
        out: list[tuple[str, dict[str, int]]] = []
        seen = {spaces.config_key(cfg)}
        for i in range(max(len(k) for k in kinds)):
            for kind in kinds:
                if i >= len(kind):
                    continue
                key = spaces.config_key({**cfg, **kind[i]})
                if key in by_key and key not in seen:
                    seen.add(key)
                    out.append((key, by_key[key]))
        return out

    def _seed_configs(
        self, m: int, by_key: dict[str, dict[str, int]], finalist_keys: list[str]
    ) -> list[tuple[str, dict[str, int]]]:
        """Warm-start seeds: the previous batch size's finalists, then the nearest entry of a
        given config table (e.g. the file vLLM ships) when that config survives pruning."""
        keys = list(finalist_keys[: self.opt.warm_start])
        table = self.opt.seed_table
        if table:
            near = table[min(table, key=lambda k: (abs(k - m), k))]
            keys.append(spaces.config_key(near))
        out, seen = [], set()
        for k in keys:
            if k in by_key and k not in seen:
                out.append((k, by_key[k]))
                seen.add(k)
        return out

    def _table_key(self, m: int) -> str | None:
        table = self.opt.seed_table
        if not table:
            return None
        return spaces.config_key(table[min(table, key=lambda k: (abs(k - m), k))])

    def _default_search(
        self, m: int, cands: list[tuple[str, dict[str, int]]], problems: list[Any], ref: Any
    ) -> Entry:
        """Budgeted search: seeds + the best already-compiled configs + structurally chosen new
        ones (round 0, few repeats), then local search around the best two (one key changed at
        a time) while the batch size's compile budget lasts, successive halving, and a
        side-by-side final that always includes the seed table's config."""
        budget = self._compile_budget(m)
        by_key = dict(cands)
        chosen, seeds = self._round0(m, cands, self.finalists_prev, self.ranked_prev)
        taken = {k for k, _ in chosen}
        reps = self.opt.halving_repeats
        ranked = self._screen(
            m, chosen, problems, ref, "halving-0", reps[0], True,
            queue_behind=lambda: self._prefetch_moves(m, chosen, seeds, by_key),
        )  # fmt: skip
        if not ranked:
            raise RuntimeError(self._nothing_left(m))
        # a first guess at the next batch size's round 0, from round 0's ranking: the workers
        # take it only when idle (see CompilePool), and the guess after the local search
        # below adds what changed
        ranked_keys = [r[2] for r in ranked]
        self._prefetch_next(m, ranked_keys[: self.opt.finalists], ranked_keys)
        tried = set(taken)
        extra_n = 0
        # local search: one-step moves from the best two, new compiles within the budget
        for _ in range(self.opt.local_rounds):
            best_before = ranked[0][0]
            moves: list[tuple[str, dict[str, int]]] = []
            for r in ranked[:2]:
                for k, c in self._neighbours(r[3], by_key):
                    if k in tried or k in self.failed or any(k == x for x, _ in moves):
                        continue
                    is_new = not self._is_compiled(m, k)
                    if is_new and budget is not None:
                        if (
                            self._new_at(m)
                            + sum(1 for x, _ in moves if not self._is_compiled(m, x))
                            >= budget
                        ):
                            continue
                    moves.append((k, c))
            moves = moves[: self.opt.moves_per_round]
            if not moves:
                break
            tried.update(k for k, _ in moves)
            extra_n += len(moves)
            ranked += self._screen(m, moves, problems, ref, "refine", reps[0], True)
            ranked.sort(key=lambda r: (r[0], r[1]))
            if ranked[0][0] >= best_before:
                break
        alive = [(r[2], r[3]) for r in ranked]
        round0 = [k for k, _ in alive]
        # from here on only compiled kernels are timed: the workers can start on the next M
        self._prefetch_next(m, round0, round0)
        for rnd, n_rep in enumerate(reps[1:], start=1):
            keep = max(self.opt.finalists, math.ceil(len(alive) / self.opt.eta))
            alive = alive[:keep]
            if len(alive) <= self.opt.finalists:
                break
            ranked = self._screen(m, alive, problems, ref, f"halving-{rnd}", n_rep, False)
            alive = [(r[2], r[3]) for r in ranked]
        finalists = alive[: self.opt.finalists]
        tk = self._table_key(m)  # the shipped config stands beside the finalists
        if tk is not None and tk in tried and tk not in self.failed:
            if all(k != tk for k, _ in finalists):
                finalists.append((tk, by_key[tk]))
        entry = self._final(m, finalists, problems, len(chosen) + extra_n)
        # next batch size starts from these (the pick first)
        self.finalists_prev = [spaces.config_key(entry.config)] + [
            k for k, _ in finalists if k != spaces.config_key(entry.config)
        ]
        head = [k for k, _ in alive]
        self.ranked_prev = head + [k for k in round0 if k not in set(head)]
        return entry

    def _round0(
        self,
        m: int,
        cands: list[tuple[str, dict[str, int]]],
        finalist_keys: list[str],
        ranked_keys: list[str],
    ) -> tuple[list[tuple[str, dict[str, int]]], list[tuple[str, dict[str, int]]]]:
        """Round 0 at m: the seeds (finalist_keys of the previous batch size, the seed table's
        nearest entry), the best-ranked configs already compiled, then new configs in
        structural order up to the exploring part of the compile budget. Returns (round 0,
        seeds)."""
        budget = self._compile_budget(m)
        by_key = dict(cands)
        seeds = self._seed_configs(m, by_key, finalist_keys)
        anchors = [c for _, c in seeds]
        chosen: list[tuple[str, dict[str, int]]] = list(seeds)
        taken = {k for k, _ in chosen}
        # configs compiled at earlier batch sizes that ranked well there cost no compile
        free = [
            (k, by_key[k])
            for k in ranked_keys
            if k in by_key and k not in taken and self._is_compiled(m, k)
        ][: self.opt.reuse_ranked]
        chosen += free
        taken.update(k for k, _ in free)
        new_used = sum(1 for k, _ in chosen if not self._is_compiled(m, k))
        explore_cap = None
        if budget is not None:
            reserve = max(budget // 3, 1)  # kept for the local search
            explore_cap = max(budget - reserve, 0)
        for k, c in self._structured(m, cands, anchors):
            if k in taken:
                continue
            if self.opt.max_configs and len(chosen) >= self.opt.max_configs:
                break
            if len(chosen) >= self.opt.round0_max:
                break
            is_new = not self._is_compiled(m, k)
            if is_new and explore_cap is not None and new_used >= explore_cap:
                continue
            chosen.append((k, c))
            taken.add(k)
            new_used += is_new
        if self.opt.max_configs:
            chosen = chosen[: max(self.opt.max_configs, len(seeds))]
        return chosen, seeds

    def _prefetch_next(self, m: int, finalist_keys: list[str], ranked_keys: list[str]) -> None:
        """Queue, as guesses, what round 0 of the next batch size will most likely compile,
        from m's current leaders (called after m's round 0 and again after its local
        search): the workers take them when idle, e.g. while m re-times compiled kernels
        only (halving, final), and would otherwise wait for that batch size to start. A
        guess that turns out wrong costs CPU only (counted), never GPU time or budget."""
        nxt = self.next_m.get(m)
        if self.pool is None or nxt is None or self.opt.mode != "default":
            return
        cands = self._candidates(nxt, quiet=True)
        chosen, _ = self._round0(nxt, cands, finalist_keys, ranked_keys)
        guess = [c for k, c in chosen if not self._is_compiled(nxt, k)]
        self.pool.prefetch(nxt, guess, speculative=True)

    def _prefetch_moves(
        self,
        m: int,
        chosen: list[tuple[str, dict[str, int]]],
        seeds: list[tuple[str, dict[str, int]]],
        by_key: dict[str, dict[str, int]],
    ) -> None:
        """Queue (behind round 0's kernels) the seeds' one-step neighbours: the warm-start seeds
        usually rank first, so these are the local search's likely moves, and the workers,
        idle while the GPU times round 0, have them ready when it asks. A speculative kernel
        the search never times costs CPU (counted in the pool's CPU seconds) but neither GPU
        time nor a place in the compile budget."""
        assert self.pool is not None
        guess: list[dict[str, int]] = []
        keys = {k for k, _ in chosen}
        for _, cfg in (seeds or chosen)[:2]:
            for k, c in self._neighbours(cfg, by_key):
                if k not in keys and k not in self.failed and not self._is_compiled(m, k):
                    keys.add(k)
                    guess.append(c)
        self.pool.prefetch(m, guess[: 2 * self.opt.moves_per_round], speculative=True)

    def _new_at(self, m: int) -> int:
        return self.new_compiles.get(m, 0)

    def tune(self, batch_sizes: Sequence[int]) -> dict[int, Entry]:
        """Tune every batch size in increasing order (warm starts go from small to large).

        With a time budget, batch sizes not finished in time are left out and listed in
        `self.skipped`.
        """
        out: dict[int, Entry] = {}
        ms = sorted(batch_sizes)
        self.next_m = dict(zip(ms[:-1], ms[1:], strict=True))
        for i, m in enumerate(ms):
            try:
                out[m] = self.tune_one(m)
            except BudgetExceeded as e:
                self.skipped = ms[i:]
                self.progress(f"[tune] {e}; not tuned: {self.skipped}")
                break
        return out
