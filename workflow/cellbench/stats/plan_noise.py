"""How much noise a serving measurement has at each level (server start, repeat within a start),
and what that lets a plan of starts and repeats see: the design of Kalibera and Jones,
"Rigorous benchmarking in reasonable time" (ISMM 2013).

Values are taken on the log scale (a change is a ratio), as a one-way random-effects model:
``log y = mu + a_start + e_repeat``. ``start_repeat_components`` estimates the two variances by
the method of moments (ANOVA): within starts the mean square of the repeats about their start's
mean; between starts (mean square between - mean square within) / n0, cut at zero.

``detectable_pct`` is the smallest change two arms of ``starts`` starts of ``repeats`` repeats
each would show at 80% power in a two-sided test at alpha 0.05, the start being the unit of
replication: arms measured apart (t with 2(starts - 1) degrees of freedom), or interleaved in
pairs of starts and repeats (the components of the pairs' log-ratio, t with starts - 1).
``repeats_per_start`` is Kalibera and Jones's optimum r* = sqrt((c_start / c_repeat) *
(var_repeat / var_start)), rounded and bounded.
Pure functions; the plan (``cellbench.config.detect_plan``) reads the data and the costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scipy import stats as sps

ALPHA = 0.05
POWER = 0.80


@dataclass(frozen=True)
class Components:
    """Variance components on the log scale, with the degrees of freedom behind each."""

    var_start: float | None  # None: fewer than 2 starts, nothing to tell starts apart
    var_repeat: float | None  # None: no start with 2 repeats
    df_start: int
    df_repeat: int


def start_repeat_components(values_by_start: Sequence[Sequence[float]]) -> Components:
    """Between-start and within-start variance of the log values, one list per server start
    (unequal sizes allowed), by the method of moments. Raises ValueError for a value that is
    not finite and positive."""
    groups = [[_log(v) for v in group] for group in values_by_start if len(group)]
    k = len(groups)
    sizes = [len(g) for g in groups]
    n = sum(sizes)
    df_w, df_b = n - k, k - 1
    means = [sum(g) / len(g) for g in groups]
    ss_w = sum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g)
    ms_w = ss_w / df_w if df_w > 0 else None
    if df_b < 1:
        return Components(None, ms_w, 0, max(df_w, 0))
    grand = sum(sum(g) for g in groups) / n
    ms_b = sum(s * (m - grand) ** 2 for s, m in zip(sizes, means, strict=True)) / df_b
    n0 = (n - sum(s * s for s in sizes) / n) / df_b
    # With one repeat per start the within part is not seen: all spread counts as between.
    var_start = max((ms_b - (ms_w or 0.0)) / n0, 0.0)
    return Components(var_start, ms_w, df_b, max(df_w, 0))


def pooled(parts: Iterable[Components]) -> Components:
    """Components of several independent sets (the arms, the metrics' sides) pooled, each
    variance weighted by its degrees of freedom."""
    parts = list(parts)

    def pool(values: list[tuple[float | None, int]]) -> tuple[float | None, int]:
        seen = [(v, df) for v, df in values if v is not None and df > 0]
        df = sum(d for _, d in seen)
        return (sum(v * d for v, d in seen) / df if df else None), df

    var_s, df_s = pool([(p.var_start, p.df_start) for p in parts])
    var_r, df_r = pool([(p.var_repeat, p.df_repeat) for p in parts])
    return Components(var_s, var_r, df_s, df_r)


def pct_to_var(pct: float) -> float:
    """A spread given in % of the level as a log-scale variance."""
    return math.log1p(pct / 100.0) ** 2


def var_to_pct(var: float) -> float:
    """A log-scale variance as a spread in % of the level."""
    return 100.0 * math.expm1(math.sqrt(var))


def detectable_pct(
    var_start: float,
    var_repeat: float,
    starts: int,
    repeats: int,
    alpha: float = ALPHA,
    power: float = POWER,
    paired: bool = False,
) -> float:
    """The smallest change (in %) two arms, each ``starts`` server starts of ``repeats``
    repeats, would show with ``power`` at two-sided ``alpha``; inf with fewer than 2 starts.
    Unpaired: the components are one arm's, the arms independent (t on 2(starts - 1) df).
    ``paired``: the arms' starts and repeats interleaved in pairs, the components those of
    the pairs' log-ratio (what both arms share cancels; t on starts - 1 df)."""
    if starts < 2 or repeats < 1:
        return math.inf
    df = starts - 1 if paired else 2 * (starts - 1)
    arms = 1.0 if paired else 2.0
    spread = math.sqrt(arms * (var_start / starts + var_repeat / (starts * repeats)))
    t = float(sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df))
    return 100.0 * math.expm1(t * spread)


def repeats_per_start(
    var_start: float, var_repeat: float, cost_start: float, cost_repeat: float, low: int, high: int
) -> int:
    """Kalibera and Jones's repeats per start, r* = sqrt((c_start / c_repeat) * (var_repeat /
    var_start)), rounded and kept within [low, high] (high when starts do not vary)."""
    if var_start <= 0 or cost_repeat <= 0:
        return high
    r = math.sqrt((cost_start / cost_repeat) * (var_repeat / var_start))
    return min(max(round(r), low), high)


def starts_needed(
    var_start: float,
    var_repeat: float,
    repeats: int,
    target_pct: float,
    max_starts: int,
    paired: bool = False,
) -> int | None:
    """The fewest starts per arm (at least 2) with which ``repeats`` repeats per start see a
    change of ``target_pct``; None when even ``max_starts`` do not."""
    for starts in range(2, max_starts + 1):
        if detectable_pct(var_start, var_repeat, starts, repeats, paired=paired) <= target_pct:
            return starts
    return None


def _log(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"a positive measurement is needed on the log scale, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"a finite measurement is needed, got {value!r}")
    return math.log(value)
