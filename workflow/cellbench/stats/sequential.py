"""Repeats that stop once the answer is known (issue 32 item 3).

The serve stage measures a point's two sides in interleaved pairs (A B, B A, ...). After each
pair it asks ``decide`` whether to measure another: ``decide`` looks only at the pairs so far,
so the stage can call it as often as it likes. Each metric of the point is tested at fixed
*looks* (pair counts 2, 3, 4, 6, 8, 12, ... up to the cap); at the first look where it crosses
a boundary it is settled, and stays so:

- **better / worse**: the paired test of ``stats.compare_metric`` (log-ratios of the pairs,
  restart noise of the floor added to the variance) has p below the look's share of alpha,
  and the change is at least the floor. The shares follow the spending function
  alpha_row * (n / cap) ** 8 (little early, most at the cap), where alpha_row = alpha / rows
  (rows: the table's tests, points x metrics). A test that crosses at any look is a false
  change at most sum(shares) = alpha_row of the time under no change (a union bound over the
  looks, which needs no model of how the looks correlate), so the table's false-change rate
  stays at most alpha however the stopping goes. It is conservative: the looks' statistics
  are correlated, and the bound charges them as if they were not.
- **equivalent within the floor**: both one-sided tests that the within-run change lies
  inside +-floor pass at the look's share (two one-sided tests), also union-bounded.
- **futile**: even a change at the optimistic end of the current estimate (its upper 90%
  bound) would have less than even odds of being called at the cap, so more pairs are money
  spent on a "within noise" that is already certain in all but name. Futility only ever
  stops a test from calling a change, so it cannot raise the false-change rate (non-binding).
- **cap reached**: the cap came first; the verdict is "within noise".

A plain t-test re-run after every pair until it is significant is what this is not: on the
H200 noise models it called 28-57% of single no-change rows changed within 10-20 pairs
(``benchmarks/results/sequential_vs_fixed_repeats_2026-12-05.md``).

The serve stage's call, after each interleaved pair of a point::

    design = Design(rows=points * 4, cap=repeats, floor_pct=report.min_change_pct)
    step = decide({metric: (a_values, b_values) for metric in comparison.METRICS},
                  comparison.METRICS, design, invalid=invalid_repeats_of_this_point)
    if step["action"] == "stop": record step["reason"], step["pairs"]; next point

and each point of bench.json records ``repeat_cap`` (the cap), so the report reruns the same
rule on the same pairs (``comparison.compare_serve``).

``decide`` is the pure function the serve stage calls; ``simulate`` is the same rule on arrays
(a test holds the two equal) for the calibration and the benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from cellbench.stats import core as stats

CONTINUE = "continue"
BETTER, WORSE = stats.BETTER, stats.WORSE
EQUIVALENT = "equivalent within the floor"
FUTILE = "futile: no change callable by the cap"
CAP = "cap reached"
INVALID = "too many invalid repeats"
SETTLED = (BETTER, WORSE, EQUIVALENT, FUTILE)
# Spending exponent: alpha_row * t ** RHO by the information fraction t = n / cap.
RHO = 8.0


def default_looks(cap: int, first: int = 2) -> tuple[int, ...]:
    """Pair counts at which the tests look: 2, 3, 4, 6, 8, 12, 16, 24, ... and the cap."""
    looks, n = [], first
    while n < cap:
        looks.append(n)
        n = max(n + 1, int(n * 1.5))
    return (*looks, cap)


@dataclass(frozen=True)
class Design:
    """The stopping rule's settings. ``rows``: tests in the table's Holm family (points x
    metrics); ``floor_pct``: the report's ``min_change_pct``; ``cap``: most pairs a point
    takes; ``min_pairs``: fewest (2: one pair has no spread); ``max_invalid``: invalid
    repeats a point may have before it stops with what it has."""

    rows: int
    cap: int = 10
    min_pairs: int = 2
    floor_pct: float = stats.DEFAULT_MIN_CHANGE_PCT
    alpha: float = stats.ALPHA
    max_invalid: int = 2
    futility: bool = True
    futility_quantile: float = 0.9
    rho: float = RHO
    looks: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.rows < 1 or self.min_pairs < 2 or self.cap < self.min_pairs:
            raise ValueError(
                f"need rows >= 1 and 2 <= min_pairs <= cap, got rows={self.rows}, "
                f"min_pairs={self.min_pairs}, cap={self.cap}"
            )
        if not self.floor_pct >= 0 or not 0 < self.alpha < 1:
            raise ValueError(
                f"need floor_pct >= 0 and 0 < alpha < 1, got {self.floor_pct}, {self.alpha}"
            )
        if not self.looks:
            object.__setattr__(self, "looks", default_looks(self.cap, self.min_pairs))
        if list(self.looks) != sorted(set(self.looks)) or self.looks[-1] != self.cap:
            raise ValueError(f"looks must rise strictly and end at the cap, got {self.looks}")

    def shares(self) -> np.ndarray:
        """alpha per look for one test (they sum to alpha / rows)."""
        t = np.asarray(self.looks, float) / self.cap
        spent = (self.alpha / self.rows) * t**self.rho
        return np.diff(np.concatenate(([0.0], spent)))


def _look_tests(d: np.ndarray, design: Design, look: int, share: np.ndarray | float):
    """Boundaries at one look on log-ratios ``d`` (..., n): (called, up, equivalent, futile)."""
    n = d.shape[-1]
    r = math.log1p(design.floor_pct / 100)
    mean = d.mean(axis=-1)
    var_n = d.var(axis=-1, ddof=1) / n
    se = np.sqrt(var_n + r * r)
    df = stats._df_known(var_n, n - 1, r * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se > 0, 2 * sps.t.sf(np.abs(mean) / np.where(se > 0, se, 1), df), 1.0)
    change = np.expm1(mean)
    called = (p < share) & (np.abs(change) * 100 >= design.floor_pct)
    se_w = np.sqrt(var_n)
    q = sps.t.ppf(1 - share, n - 1)
    equivalent = (mean + q * se_w < r) & (mean - q * se_w > -r) & ~called
    futile = np.zeros(mean.shape, bool)
    if design.futility and look < design.cap:
        optimistic = np.abs(mean) + sps.t.ppf(design.futility_quantile, n - 1) * se_w
        at_cap = np.sqrt(var_n * n / design.cap + r * r)
        last = design.shares()[-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            best = np.where(at_cap > 0, optimistic / np.where(at_cap > 0, at_cap, 1), np.inf)
        futile = (best < sps.norm.ppf(1 - last / 2)) & ~called & ~equivalent
    return called, mean > 0, equivalent, futile


@dataclass
class MetricState:
    status: str  # CONTINUE or one of SETTLED or CAP
    verdict: str  # better / worse / within noise
    pairs: int  # pairs it had when settled (or so far)


def decide_metric(
    a: Sequence[float], b: Sequence[float], higher_is_better: bool, design: Design
) -> MetricState:
    """One metric's state after the pairs (a[k], b[k]) so far (valid pairs only, in order)."""
    va, vb = np.asarray(a, float), np.asarray(b, float)
    if va.shape != vb.shape:
        raise ValueError(f"need as many repeats of A as of B, got {len(va)} and {len(vb)}")
    if not (np.all(va > 0) and np.all(vb > 0)):
        raise ValueError("decide_metric needs positive values (invalid repeats left out)")
    d = np.log(vb) - np.log(va)
    for look, share in zip(design.looks, design.shares(), strict=True):
        if look > len(d):
            break
        called, up, equivalent, futile = (
            bool(x) for x in _look_tests(d[:look], design, look, share)
        )
        if called:
            verdict = BETTER if up == higher_is_better else WORSE
            return MetricState(verdict, verdict, look)
        if equivalent:
            return MetricState(EQUIVALENT, stats.NOISE, look)
        if futile:
            return MetricState(FUTILE, stats.NOISE, look)
    if len(d) >= design.cap:
        return MetricState(CAP, stats.NOISE, design.cap)
    return MetricState(CONTINUE, stats.NOISE, len(d))


def decide(
    pairs: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    higher_is_better: Mapping[str, bool],
    design: Design,
    *,
    invalid: int = 0,
) -> dict:
    """Whether a point needs another interleaved pair.

    ``pairs``: per metric, (A's values, B's values) of the valid pairs so far, pair k at
    index k; ``invalid``: repeats of this point that were invalid (left out of ``pairs``).
    Returns ``action`` ("continue" or "stop"), ``reason`` (why it stopped: "settled" when
    every metric is, else "cap reached" or "too many invalid repeats"; "continue" while
    going on), ``pairs`` (valid pairs used), ``invalid`` and ``metrics``: per metric
    ``status`` (better / worse / equivalent within the floor / futile / cap reached /
    continue), ``verdict`` and the ``pairs`` it was settled at."""
    lengths = {len(a) for a, _ in pairs.values()} | {len(b) for _, b in pairs.values()}
    if len(lengths) > 1:
        raise ValueError(f"every metric needs the same pairs, got counts {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    states = {
        m: decide_metric(a, b, higher_is_better[m], design) if n >= 2 else None
        for m, (a, b) in pairs.items()
    }
    out = {"pairs": n, "invalid": invalid}
    out["metrics"] = {
        m: (
            {"status": s.status, "verdict": s.verdict, "pairs": s.pairs}
            if s is not None
            else {"status": CONTINUE, "verdict": stats.NOISE, "pairs": n}
        )
        for m, s in states.items()
    }
    open_ = [m for m, s in out["metrics"].items() if s["status"] == CONTINUE]
    if invalid > design.max_invalid:
        reason = INVALID
    elif n >= design.cap:
        reason = CAP
    elif n >= design.min_pairs and not open_:
        reason = "settled"
    else:
        reason = CONTINUE
    out["action"] = CONTINUE if reason == CONTINUE else "stop"
    out["reason"] = reason
    return out


def simulate(a: np.ndarray, b: np.ndarray, higher: np.ndarray, design: Design, points: int) -> dict:
    """``decide`` on arrays: a, b of shape (tables, points * metrics, cap) hold every pair a
    point could take; the rows of a point are contiguous (metrics vary fastest). Returns
    ``codes`` (tables, rows: +1 better, -1 worse, 0 within noise), ``status`` (tables, rows:
    index into SETTLED + (CAP,)), ``settled_at`` (tables, rows) and ``pairs`` (tables,
    points): the pairs each point used (its last metric's settling look, or the cap)."""
    tables, rows, cap = a.shape
    if cap != design.cap or rows % points:
        raise ValueError(f"arrays of {cap} pairs and {rows} rows do not fit the design")
    d = np.log(b) - np.log(a)
    status = np.full((tables, rows), len(SETTLED), np.int8)  # CAP unless settled earlier
    codes = np.zeros((tables, rows), np.int8)
    settled_at = np.full((tables, rows), cap, np.int32)
    open_ = np.ones((tables, rows), bool)
    higher = np.broadcast_to(np.asarray(higher, bool), (tables, rows))
    for look, share in zip(design.looks, design.shares(), strict=True):
        called, up, equivalent, futile = _look_tests(d[..., :look], design, look, share)
        for index, hit in ((None, called), (2, equivalent), (3, futile)):
            new = hit & open_
            if index is None:
                better = up == higher
                status[new] = np.where(better, 0, 1)[new]
                codes[new] = np.where(better, 1, -1)[new]
            else:
                status[new] = index
            settled_at[new] = look
            open_ &= ~new
    used = settled_at.reshape(tables, points, rows // points).max(axis=-1)
    return {"codes": codes, "status": status, "settled_at": settled_at, "pairs": used}
