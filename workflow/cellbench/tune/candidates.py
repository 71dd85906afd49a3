"""The search's steps on one candidate config: pruning, the correctness check, timing and
its log record, failures, and the screen that checks and times a list of candidates.

In-container module: stdlib + torch (+ triton through the backend).

`CandidateSteps` is one of the objects the search's driver (`search.Tuner`) is given; the
default mode's search and the final pick use it too. `rel_error` is the check's measure, also
used by the backends and the benchmarks.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.search_types import AtSize, BudgetExceeded, SearchContext
from cellbench.tune.timing import Timing, time_calls

__all__ = ["CandidateSteps", "rel_error", "commonest_reason"]


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


class CandidateSteps:
    """One candidate's steps (check, timing, failure), the pruned candidate list of a batch
    size and the screen over a list of candidates.

    space: candidate configs (spaces.cuda_space() etc.), visited in one random order (by the
    options' seed) at every batch size."""

    def __init__(self, ctx: SearchContext, space: Sequence[dict[str, int]]):
        self.ctx = ctx
        self.space = list(space)
        rng = random.Random(ctx.opt.seed)
        self.order = list(range(len(self.space)))
        rng.shuffle(self.order)  # one random order for all batch sizes

    # -- one candidate ----------------------------------------------------------------------
    def check(self, m: int, cfg: dict[str, int], key: str, problems: list[Any], ref: Any):
        """Correctness against the reference at the first batch size; False = failed."""
        ctx = self.ctx
        prev = ctx.log.lookup(m, key, "check")
        if prev is not None:
            return prev["status"] == "checked", prev.get("error")
        t0 = time.perf_counter()
        try:
            out = ctx.backend.output(problems[0], cfg)
            err = rel_error(out, ref)
        except Exception as e:  # noqa: BLE001 - any compile/launch failure disqualifies
            self.fail(m, cfg, key, "check", f"{type(e).__name__}: {e}")
            return False, None
        finally:
            ctx.ledger.note(m, key)
            ctx.stats.gpu_s += time.perf_counter() - t0 if ctx.opt.on_gpu else 0.0
        bound = ctx.backend.error_bound
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
            ctx.failed.add(key)
            ctx.stats.failed += 1
        ctx.log.append(rec)
        return ok, err

    def fail(self, m: int, cfg: dict[str, int], key: str, stage: str, why: str) -> None:
        """Mark config `key` failed (never tried again) and log why."""
        self.ctx.failed.add(key)
        self.ctx.stats.failed += 1
        self.ctx.log.append(
            {"m": m, "key": key, "config": cfg, "stage": stage, "status": "failed", "reason": why}
        )

    def time(
        self,
        m: int,
        cfg: dict[str, int],
        key: str,
        stage: str,
        problems: list[Any],
        repeats: int,
        abandon_above_us: float | None,
    ) -> Timing | None:
        """One config timed at m (read back from the log where a resumed run has it)."""
        ctx = self.ctx
        prev = ctx.log.lookup(m, key, stage)
        if prev is not None:
            ctx.stats.reused += 1
            if prev["status"] != "timed":
                return None
            return Timing(
                prev["time_us"],
                prev.get("samples_us", []),
                prev.get("method", ""),
                prev.get("abandoned", False),
                0.0,
            )
        self.pool_wait(m, key, cfg)
        calls = [ctx.backend.call(p, cfg) for p in problems]
        try:
            t = time_calls(
                calls,
                on_gpu=ctx.opt.on_gpu,
                graph_calls=ctx.opt.graph_calls,
                repeats=repeats,
                abandon_above_us=abandon_above_us,
            )
        except Exception as e:  # noqa: BLE001 - compile errors, out of resources, ...
            self.fail(m, cfg, key, stage, f"{type(e).__name__}: {str(e)[:300]}")
            return None
        finally:
            ctx.ledger.note(m, key)
        self.record_timed(m, key, cfg, stage, t)
        return t

    def record_timed(self, m: int, key: str, cfg: dict[str, int], stage: str, t: Timing):
        """Count a timing and write its log record (the record a resumed run reads back)."""
        ctx = self.ctx
        ctx.stats.timed += 1
        ctx.stats.gpu_s += t.wall_s if ctx.opt.on_gpu else 0.0
        ctx.log.append(
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

    def pool_wait(self, m: int, key: str, cfg: dict[str, int]) -> None:
        """Wait for a compile worker's warm-up of a kernel not compiled yet in this run."""
        pool = self.ctx.pool
        if pool is not None and not self.ctx.ledger.is_compiled(m, key):
            pool.wait(m, cfg)

    # -- one batch size ---------------------------------------------------------------------
    def candidates(self, m: int, quiet: bool = False) -> list[tuple[str, dict[str, int]]]:
        """Configs of the space that survive pruning at m, one per distinct kernel; pruned ones
        are logged and counted unless `quiet` (a look ahead at the next batch size)."""
        ctx = self.ctx
        kept: list[tuple[str, dict[str, int]]] = []
        identity = getattr(ctx.backend, "kernel_identity", None)
        first_of: dict[str, str] = {}  # kernel identity -> first config key kept
        for idx in self.order:
            cfg = self.space[idx]
            key = spaces.config_key(cfg)
            why = spaces.prune_reason(
                cfg, m=m, n=ctx.n, k=ctx.k, operand_bytes=ctx.operand_bytes, limits=ctx.limits
            )
            if why is None and identity is not None and key not in ctx.failed:
                kid = identity(m, cfg)
                if kid in first_of:  # e.g. the few-token path ignores BLOCK_SIZE_M
                    why = f"same kernel at M={m} as {first_of[kid]} (keys this path ignores)"
                else:
                    first_of[kid] = key
            if why is not None and quiet:
                continue
            if why is not None:
                ctx.stats.pruned += 1
                ctx.log.append(
                    {
                        "m": m,
                        "key": key,
                        "config": cfg,
                        "stage": "prune",
                        "status": "pruned",
                        "reason": why,
                    }
                )
            elif key not in ctx.failed:
                kept.append((key, cfg))
        return kept

    def screen(
        self,
        at: AtSize,
        cands: list[tuple[str, dict[str, int]]],
        stage: str,
        repeats: int,
        abandon: bool,
        queue_behind: Callable[[], None] | None = None,
    ) -> list[tuple[float, int, str, dict[str, int], Timing]]:
        """Check (where `at.check`) and time `cands`; returns sorted (time, order, ...).
        With compile workers, `queue_behind` queues speculative warm-ups behind `cands`'."""
        ctx, m = self.ctx, at.m
        if ctx.pool is not None:  # the workers compile ahead of the GPU (only new kernels)
            ctx.pool.prefetch(m, [c for k, c in cands if not ctx.ledger.is_compiled(m, k)])
            if queue_behind is not None:
                queue_behind()
        results = []
        best = math.inf
        for i, (key, cfg) in enumerate(cands):
            if key in ctx.failed:
                continue
            if ctx.over_budget():
                raise BudgetExceeded(f"time budget {ctx.opt.time_budget_s} s spent at M={m}")
            if at.check:
                self.pool_wait(m, key, cfg)  # let the workers compile it, not this process
                ok, _ = self.check(m, cfg, key, at.problems, at.ref)
                if not ok:
                    continue
            limit = best * ctx.opt.abandon_factor if abandon and math.isfinite(best) else None
            t = self.time(m, cfg, key, stage, at.problems, repeats, limit)
            if t is None:
                continue
            best = min(best, t.median_us)
            results.append((t.median_us, i, key, cfg, t))
            if (i + 1) % 100 == 0:  # long stages: show they are moving
                ctx.progress(
                    f"[tune]   M={m} {stage}: {i + 1}/{len(cands)} configs, best {best:.2f} us, "
                    f"{time.perf_counter() - ctx.t_start:.0f} s since start"
                )
        results.sort(key=lambda r: (r[0], r[1]))
        return results

    def nothing_left(self, m: int) -> str:
        """Why batch size m has no config left: the commonest failure (its message and how
        many configs hit it), so the terminal says more than "every candidate failed"."""
        failed = self.ctx.log.reasons("failed")
        pruned = self.ctx.log.reasons("pruned", m)
        head = (
            f"M={m}: every candidate config failed or was pruned ({len(failed)} configs failed "
            f"so far, {len(pruned)} pruned at M={m})"
        )
        for what, reasons in (("failure", failed), ("pruning reason", pruned)):
            if reasons:
                n, total, example = commonest_reason(reasons.values())
                return f"{head}; commonest {what}, {n} of {total} configs: {example}"
        return f"{head}; the space held no config to try"
