"""Error rates of a serving verdict function, simulated on fitted noise models.

A verdict function takes two arrays A and B of shape (tables, rows, starts, repeats) (each
start a fresh server per side, its repeats interleaved pairs) and each row's direction
(True: higher is better), and returns per row +1 (better), -1 (worse), 0 (inconclusive) or
2 (equivalent): ``report_verdicts`` is the report's own fixed-count rule
(``starts.fixed_verdicts``, which a test holds equal to ``comparison.compare_serve``),
``sequential_verdicts`` the group-sequential rule the serve stage stops on.

- **False-change rate**: the share of A/A tables (no real change; every start of each side
  its own server start offset) with at least one row called better or worse, with its
  Clopper-Pearson 95% interval.
- **Power**: the share of tables in which a known change of B (worse by ``effect_pct`` on one
  metric at the first point) is called worse there, the other rows A/A.
- **Stated MDC**: the smallest change the rule promises to see with 80% power
  (``starts.mdc_pct`` at the model's true start-mean variance and the design's level):
  ``expected_mdc``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import stats as sps

from cellbench.stats import noise, sequential, starts

VerdictFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
HIGHER = np.array(list(noise.METRICS.values()))
CHANGED = (1, -1)


def report_verdicts(margin_pct: float = starts.DEFAULT_MARGIN_PCT, **kw) -> VerdictFn:
    """The report's fixed-count verdicts as a verdict function."""
    fn = functools.partial(starts.fixed_verdicts, margin_pct=margin_pct, **kw)
    return lambda a, b, higher: fn(a, b, higher)


def sequential_verdicts(points: int, design_kw: dict | None = None, **kw) -> VerdictFn:
    """The group-sequential rule as a verdict function (cap: the arrays' starts)."""

    def verdict(a: np.ndarray, b: np.ndarray, higher: np.ndarray) -> np.ndarray:
        design = sequential.Design(rows=a.shape[1], cap=a.shape[2], **(design_kw or {}))
        return sequential.simulate(a, b, higher, design, points, **kw)["codes"]

    return verdict


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of k successes in n."""
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(sps.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(sps.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def _flat(a: np.ndarray) -> np.ndarray:
    """(tables, points, metrics, starts, repeats) -> (tables, points * metrics, ...)."""
    t, p, m = a.shape[:3]
    return a.reshape(t, p * m, *a.shape[3:])


def false_change_rate(
    model: noise.NoiseModel,
    verdict: VerdictFn,
    *,
    starts_: int,
    repeats: int,
    tables: int = 1000,
    points: int = 4,
    kind: str = "normal",
    seed: int = 0,
) -> dict:
    """A/A tables of ``points`` grid points x the model's metrics: the share with any row
    called better or worse, and its 95% interval."""
    rng = np.random.default_rng(seed)
    a, b = noise.draw_starts(model, rng, tables=tables, points=points, starts=starts_,
                             repeats=repeats, kind=kind)  # fmt: skip
    codes = verdict(_flat(a), _flat(b), np.tile(HIGHER, points))
    k = int(np.isin(codes, CHANGED).any(axis=1).sum())
    low, high = clopper_pearson(k, tables)
    return {"rate": k / tables, "ci_low": low, "ci_high": high, "tables": tables}


def power(
    model: noise.NoiseModel,
    verdict: VerdictFn,
    *,
    metric: str,
    effect_pct: float,
    starts_: int,
    repeats: int,
    tables: int = 1000,
    points: int = 4,
    kind: str = "normal",
    seed: int = 0,
) -> float:
    """Share of tables in which B, worse by ``effect_pct`` % on ``metric`` at the first point,
    is called worse there (the table's other rows A/A, in the same family)."""
    j = list(noise.METRICS).index(metric)
    sign = -1.0 if noise.METRICS[metric] else 1.0  # worse: lower throughput, longer latency
    effect = np.zeros((tables, points, len(noise.METRICS)))
    effect[:, 0, j] = sign * effect_pct
    rng = np.random.default_rng(seed)
    a, b = noise.draw_starts(model, rng, tables=tables, points=points, starts=starts_,
                             repeats=repeats, effect_pct=effect, kind=kind)  # fmt: skip
    codes = verdict(_flat(a), _flat(b), np.tile(HIGHER, points))[:, j]
    return float(np.mean(codes == -1))


def start_mean_variance(model: noise.NoiseModel, metric: str, repeats: int) -> float:
    """The true variance of one start's mean paired log-ratio under ``model``: both sides'
    start offsets and each pair's own spread (what a pair shares cancels)."""
    j = list(noise.METRICS).index(metric)
    return 2 * float(model.start[j]) ** 2 + 2 * float(model.own[j]) ** 2 / repeats


def row_variances(model: noise.NoiseModel, repeats: int, points: int) -> np.ndarray:
    """``start_mean_variance`` of every row of a table (points x metrics, metrics fastest):
    an earlier run's prior as the archive would give it, each metric its own."""
    per_metric = [start_mean_variance(model, m, repeats) for m in noise.METRICS]
    return np.tile(per_metric, points)


def expected_mdc(
    model: noise.NoiseModel,
    metric: str,
    *,
    starts_: int,
    repeats: int,
    rows: int,
    prior_df: int = 0,
    alpha: float = starts.ALPHA,
) -> float:
    """The detectable change (%) the rule states for this model's true noise, at the table's
    level alpha / rows, with ``starts_ - 1`` degrees of freedom (plus a prior's)."""
    var = start_mean_variance(model, metric, repeats)
    return starts.mdc_pct(math.sqrt(var / starts_), starts_ - 1 + prior_df, alpha / rows)


def check(
    verdict: VerdictFn,
    model: noise.NoiseModel,
    *,
    starts_: int,
    repeats: int = 1,
    points: int = 4,
    effect_pct: float,
    metric: str = "mean_tpot_ms",
    max_rate: float = 0.05,
    min_power: float = starts.POWER,
    tables: int = 2000,
    seed: int = 0,
) -> list[str]:
    """What ``verdict`` gets wrong on ``model``: a false-change rate of A/A tables above
    ``max_rate``, or a power below ``min_power`` at a planted change of ``effect_pct`` (at
    least the stated detectable change). Each failure one line, with the figure."""
    failures = []
    r = false_change_rate(model, verdict, starts_=starts_, repeats=repeats, tables=tables,
                          points=points, seed=seed)  # fmt: skip
    if r["rate"] > max_rate:
        failures.append(
            f"false-change rate {r['rate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
            f"> {max_rate}"
        )
    got = power(model, verdict, metric=metric, effect_pct=effect_pct, starts_=starts_,
                repeats=repeats, tables=tables, points=points, seed=seed + 1)  # fmt: skip
    if got < min_power:
        failures.append(f"power {got:.3f} at a {effect_pct:.1f}% change < {min_power}")
    return failures
