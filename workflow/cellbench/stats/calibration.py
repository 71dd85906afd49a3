"""Error rates of a serving verdict function, simulated on fitted noise models (issue 32
item 2).

A verdict function takes two arrays of repeats, A and B, of shape (tables, rows, repeats)
and each row's direction (True: higher is better), and returns +1 (better), -1 (worse) or 0
(within noise) per row: ``report_verdicts`` is the report's own (``stats.table_verdicts``,
which a test holds equal to ``comparison.compare_serve``'s scalar path).

- **False-change rate**: the share of A/A tables (no real change; each side its own server
  start, as two arms of one run are) with at least one row called better or worse, with its
  Clopper-Pearson 95% interval.
- **Power**: the share of tables in which a known change of B (worse by ``effect_pct`` on one
  metric) is called worse, on a table of just that row (the ``stats.pairs_needed`` promise is
  made before Holm) or of a whole grid (Holm over all rows; the other rows A/A).

``check`` runs both over models, repeat counts and effects and lists what fails: a false-change
rate above the limit, or a power below what ``stats.pairs_needed`` promises where it promises
one. The promise is a lower bound: it takes restart noise as large as the floor, and the
floor is the largest start spread of all models, so on most models and metrics the real power
is higher (where it names no count, a change can still be called, just not promised).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as sps

from cellbench.stats import core as stats
from cellbench.stats import noise

VerdictFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
HIGHER = np.array(list(noise.METRICS.values()))
# The metrics the issue names for known effects (TTFT, TPOT, throughput), by column index.
EFFECT_METRICS = {m: i for i, m in enumerate(noise.METRICS) if m != "mean_e2el_ms"}


def report_verdicts(
    test: str = stats.PAIRED, min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT, **kw
) -> VerdictFn:
    """The report's verdicts as a verdict function (``stats.table_verdicts``)."""
    fn = functools.partial(stats.table_verdicts, test=test, min_change_pct=min_change_pct, **kw)
    return lambda a, b, higher: fn(a, b, higher)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of k successes in n."""
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(sps.beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(sps.beta.ppf(1 - tail, k + 1, n - k))
    return low, high


def _flat(a: np.ndarray) -> np.ndarray:
    """(tables, points, metrics, repeats) -> (tables, points * metrics, repeats)."""
    t, p, m, n = a.shape
    return a.reshape(t, p * m, n)


def false_change_rate(
    model: noise.NoiseModel,
    verdict: VerdictFn,
    *,
    pairs: int,
    tables: int = 1000,
    points: int = 4,
    kind: str = "normal",
    seed: int = 0,
) -> dict:
    """A/A tables of ``points`` grid points x the model's metrics: the share with any row
    called, and its 95% interval."""
    rng = np.random.default_rng(seed)
    a, b = noise.draw(model, rng, tables=tables, points=points, pairs=pairs, kind=kind)
    called = verdict(_flat(a), _flat(b), np.tile(HIGHER, points)) != 0
    k = int(called.any(axis=1).sum())
    low, high = clopper_pearson(k, tables)
    return {
        "rate": k / tables,
        "ci_low": low,
        "ci_high": high,
        "tables": tables,
        "rows": 4 * points,
    }


def power(
    model: noise.NoiseModel,
    verdict: VerdictFn,
    *,
    metric: str,
    effect_pct: float,
    pairs: int,
    tables: int = 1000,
    points: int = 1,
    kind: str = "normal",
    seed: int = 0,
    whole_point: bool = False,
) -> float:
    """Share of tables in which B, worse by ``effect_pct`` % on ``metric`` at the first point,
    is called worse there. ``points`` = 1 and not ``whole_point``: a one-row table (the test
    alone, as ``stats.pairs_needed`` promises); else the grid's rows, Holm over all of them."""
    j = list(noise.METRICS).index(metric)
    sign = -1.0 if noise.METRICS[metric] else 1.0  # worse: lower throughput, longer latency
    effect = np.zeros((tables, points, len(noise.METRICS)))
    effect[:, 0, j] = sign * effect_pct
    rng = np.random.default_rng(seed)
    a, b = noise.draw(model, rng, tables=tables, points=points, pairs=pairs, effect_pct=effect,
                      kind=kind)  # fmt: skip
    if points == 1 and not whole_point:
        codes = verdict(a[:, 0, j : j + 1], b[:, 0, j : j + 1], HIGHER[j : j + 1])[:, 0]
    else:
        codes = verdict(_flat(a), _flat(b), np.tile(HIGHER, points))[:, j]
    return float(np.mean(codes == -1))


def promised_pairs(
    model: noise.NoiseModel, metric: str, effect_pct: float, floor: float
) -> int | None:
    """What ``stats.pairs_needed`` promises for this model's pair spread of ``metric``."""
    j = list(noise.METRICS).index(metric)
    cv_pair = 100 * float(np.sqrt(2) * model.own[j])  # sd of a pair's log-ratio, x 100
    return stats.pairs_needed(cv_pair, effect_pct, floor)


def check(
    verdict: VerdictFn,
    models: Sequence[noise.NoiseModel],
    *,
    floor: float = stats.DEFAULT_MIN_CHANGE_PCT,
    pairs: Sequence[int] = (3, 10, 20),
    effects: Sequence[float] = (1.0, 2.0, 5.0, 10.0, 30.0, 50.0),
    kinds: Sequence[str] = ("normal", "empirical"),
    max_rate: float = 0.05,
    cap: int = 40,
    tables: int = 1000,
    seed: int = 0,
) -> list[str]:
    """What ``verdict`` gets wrong on ``models``: each failure one line. False-change rate
    per (model, kind, pairs) at most ``max_rate``; per (model, kind, metric, effect) power at
    least 0.75 at the pairs ``promised_pairs`` names when that is at most ``cap`` (0.8
    promised; the margin is the simulation's error and the t approximation's)."""
    failures = []
    for model in models:
        for kind in kinds:
            for n in pairs:
                r = false_change_rate(model, verdict, pairs=n, kind=kind, tables=tables, seed=seed)
                if r["rate"] > max_rate:
                    failures.append(
                        f"{model.name}/{kind}/{n} pairs: false-change rate {r['rate']:.3f} "
                        f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] > {max_rate}"
                    )
            for metric in EFFECT_METRICS:
                for effect in effects:
                    n = promised_pairs(model, metric, effect, floor)
                    if n is None or n > cap:
                        continue
                    got = power(model, verdict, metric=metric, effect_pct=effect, pairs=n,
                                kind=kind, tables=tables, seed=seed)  # fmt: skip
                    if got < 0.75:
                        failures.append(
                            f"{model.name}/{kind}/{metric} {effect:g}% at {n} pairs: power "
                            f"{got:.3f}, promised 0.8"
                        )
    return failures
