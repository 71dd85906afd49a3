"""The search's steps on one candidate config: pruning, the correctness check, timing and
its log record, failures, and which kernels are compiled already (the compile budget).

In-container module: stdlib + torch (+ triton through the backend).

Split from search.py: `CandidateSteps` is mixed into `Tuner` (search.py),
whose attributes (backend, log, stats, pool, ...) these methods use; `rel_error` is the check's
measure, also used by the backends and the benchmarks.
"""

from __future__ import annotations

import math
import time
from typing import Any

from cellbench.tune import spaces
from cellbench.tune.timing import Timing, time_calls

__all__ = ["CandidateSteps", "rel_error"]


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


class CandidateSteps:
    """One candidate's steps and the compile accounting (mixed into `search.Tuner`)."""

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

    def _stand_in_m(self, m: int) -> int:
        """The smallest batch size whose kernels are m's (same `_spec`): where compile workers
        run a config to compile it (vLLM's kernel has no compile-only entry), they run it
        there. At m itself their runs shared the GPU with the timings: on an H100 (fp8, 18
        sizes) the first configs timed at each M >= 1024 measured 7-13% slow, and one was
        the previous size's pick (M=1024: 342.5 us in round 0, 302.9 us re-timed), so the
        local search went round another tile (1.028x exhaustive's pick); 12 workers at
        M=16384 also ran the GPU out of memory."""
        spec = self._spec(m)
        return next((x for x in range(1, min(m, 64)) if self._spec(x) == spec), m)

    def _is_compiled(self, m: int, key: str) -> bool:
        return (self._spec(m), key) in self.compiled

    def _note_compiled(self, m: int, key: str) -> None:
        k = (self._spec(m), key)
        if k not in self.compiled:
            self.compiled.add(k)
            self.new_compiles[m] = self.new_compiles.get(m, 0) + 1

    def _compile_budget(self, m: int) -> int | None:
        """New kernels allowed at batch size m: the larger budget at the first batch size of
        each M-dependent specialisation (nothing compiled for it can be reused yet) and at a
        batch size far from the one tuned before it (what was compiled there suits other
        tiles: see `_far`)."""
        if self.opt.compile_budget is None:
            return None
        first, later = self.opt.compile_budget
        spec = self._spec(m)
        self.class_first.setdefault(spec, m)
        return first if self.class_first[spec] == m or self._far(m) else later

    def _new_at(self, m: int) -> int:
        return self.new_compiles.get(m, 0)
