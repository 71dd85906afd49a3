"""Serving comparisons with server starts as the unit of replication.

A two-sided serve job measures each side in several server starts (rounds: a fresh server per
side, A B then B A, ...), each start measuring the grid ``serve.repeats`` times. On the log
scale one value of a metric at a point is

    log y[start k, repeat j] = level + s[k] + e[k, j]

with s the start's offset (variance ``between``) and e a repeat's own spread inside its start
(variance ``within``). ``components`` estimates both from the data by the one-way
random-effects method of moments; ``pool`` combines them with the components of earlier runs
of the same model, image and point (``prior_from_benches`` reads them from bench.json files).
Nothing here is a fixed or assumed variance.

The statistic a row shows is the ratio of the two sides' geometric means, each the mean over
starts of a start's mean log value (every start weighs the same). Its change, its interval,
its p-value and its verdict are all computed on that one number:

- interleaved sides (both arms of one job, two images of one job): the log-ratio of each
  repeat pair, averaged per start, then over starts; its variance is the spread of the start
  means (what both sides of a round share cancels), with K - 1 degrees of freedom, pooled
  with a prior's start-level variance where one is given (``paired``);
- sides never interleaved (a run against an archived run): each side's start means on their
  own, Welch's variance and Welch-Satterthwaite degrees of freedom (``unpaired``).

``verdicts`` then gives every tested row of a table the same level alpha / m (Bonferroni over
the m tested rows; ``level`` of a row measured sequentially is its look's nominal level
instead). The interval is the t interval at confidence 1 - level, and the adjusted p-value is
p * alpha / level, so "p_adj < alpha" and "the interval excludes no change" are one statement.
Four answers:

- **better / worse**: the interval excludes no change and is not inside +-margin;
- **equivalent**: the interval lies inside +-margin (``report.min_change_pct``);
- **inconclusive**: neither; the row says what it could have seen: the smallest change it
  detects with 80% power at its level, noise and replication (``mdc_pct``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import optimize
from scipy import stats as sps

ALPHA = 0.05
POWER = 0.8
# The smallest change worth calling, used as the equivalence margin (vLLM's nightly
# comparison flags 2% regressions).
DEFAULT_MARGIN_PCT = 2.0
BETTER, WORSE = "better", "worse"
EQUIVALENT, INCONCLUSIVE = "equivalent", "inconclusive"
ANSWERS = (BETTER, WORSE, EQUIVALENT, INCONCLUSIVE)
# judge_arrays' codes
CODES = {1: BETTER, -1: WORSE, 2: EQUIVALENT, 0: INCONCLUSIVE}
ONE_START = "n/a (one server start a side, no history: start-to-start noise not measured)"
PAIRED, UNPAIRED = "paired by start", "unpaired"
NAN = float("nan")


@dataclass(frozen=True)
class Components:
    """Variance components of one metric at one point, in squared log units: ``between``
    server starts and ``within`` a start (between its repeats), with their degrees of
    freedom (0: not estimable, the value is NaN)."""

    between: float
    within: float
    df_between: int
    df_within: int

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}  # fmt: skip

    @classmethod
    def from_json(cls, obj: Mapping) -> Components:
        def num(key: str) -> float:
            value = obj.get(key)
            return NAN if value is None else float(value)

        return cls(num("between"), num("within"), int(obj["df_between"]), int(obj["df_within"]))

    def start_variance(self, repeats: float) -> float:
        """Variance of one start's mean of ``repeats`` repeats."""
        within = 0.0 if math.isnan(self.within) else self.within
        return self.between + within / repeats


def components(groups: Sequence[Sequence[float]]) -> Components:
    """One-way random-effects method of moments over starts (``groups``: per start its
    repeats' log values; starts may hold different counts). within = MSW; between =
    max(0, (MSB - MSW) / n0) with n0 = (N - sum n_k^2 / N) / (K - 1)."""
    groups = [np.asarray(g, float) for g in groups if len(g)]
    k = len(groups)
    n = np.array([len(g) for g in groups], float)
    total = float(n.sum())
    df_w = int(total - k)
    means = np.array([g.mean() for g in groups]) if k else np.array([])
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in groups))
    within = ssw / df_w if df_w > 0 else NAN
    if k < 2:
        return Components(NAN, within, 0, max(df_w, 0))
    grand = float((n * means).sum() / total)
    msb = float((n * (means - grand) ** 2).sum() / (k - 1))
    n0 = (total - float((n**2).sum()) / total) / (k - 1)
    between = max(0.0, (msb - (within if df_w > 0 else 0.0)) / n0)
    return Components(between, within, k - 1, df_w)


def pool(parts: Iterable[Components | None]) -> Components | None:
    """Components of several runs of the same model, image and point as one estimate: each
    component the degrees-of-freedom-weighted mean of the runs that estimate it."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None

    def weighted(value: str, df: str) -> tuple[float, int]:
        have = [(getattr(p, value), getattr(p, df)) for p in parts if getattr(p, df) > 0]
        dof = sum(d for _, d in have)
        return (sum(v * d for v, d in have) / dof, dof) if dof else (NAN, 0)

    between, df_b = weighted("between", "df_between")
    within, df_w = weighted("within", "df_within")
    return Components(between, within, df_b, df_w)


def start_means_variance(
    groups: Sequence[Sequence[float]], prior: Components | None = None
) -> tuple[float, float, int]:
    """(mean over starts of the start means, variance of one start mean, its degrees of
    freedom). From the data: the start means' sample variance (K - 1 degrees of freedom),
    which estimates between + within * mean(1/n_k) whatever the split. With ``prior``: that
    pooled with the prior's between + within / r_h (r_h: this run's harmonic mean repeats per
    start) weighted by the prior's between-start degrees of freedom."""
    groups = [np.asarray(g, float) for g in groups if len(g)]
    means = np.array([g.mean() for g in groups])
    k = len(means)
    centre = float(means.mean()) if k else NAN
    var_d = float(means.var(ddof=1)) if k > 1 else NAN
    prior_var, prior_df = NAN, 0
    if prior is not None and prior.df_between > 0 and not math.isnan(prior.between):
        r_h = 1.0 / float(np.mean([1.0 / len(g) for g in groups])) if k else 1.0
        prior_var, prior_df = prior.start_variance(r_h), prior.df_between
    var, df = pooled_variance(var_d, max(k - 1, 0), prior_var, prior_df)
    return centre, float(var), int(df)


def pooled_variance(var_data, df_data: int, prior_var, prior_df: int):
    """A start mean's variance from the data (``df_data`` degrees of freedom) pooled with a
    prior's, weighted by degrees of freedom: (variance, degrees of freedom). Works on
    arrays; with neither, (NaN, 0). The one place every serving test takes its variance."""
    if not prior_df:
        return (var_data if df_data else np.nan * np.asarray(var_data)), df_data
    if not df_data:
        return prior_var + 0 * np.nan_to_num(np.asarray(var_data, float)), prior_df
    return (df_data * var_data + prior_df * prior_var) / (df_data + prior_df), df_data + prior_df


def _logs(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = []
    for g in groups:
        v = np.asarray(g, float)
        if not (np.isfinite(v).all() and (v > 0).all()):
            raise ValueError("a serving comparison needs finite positive values")
        if len(v):
            out.append(np.log(v))
    return out


def compare(
    a: Sequence[Sequence[float]],
    b: Sequence[Sequence[float]],
    *,
    higher_is_better: bool,
    paired: bool,
    prior: Mapping[str, Components | None] | None = None,
) -> dict:
    """One metric at one point: ``a`` and ``b`` hold per server start the repeats' values.
    ``paired``: start k of A and of B ran in one round, repeat j of each one pair (same
    count per start on both sides); else the sides were never interleaved. ``prior``: earlier
    runs' components, key "d" (of the paired log-ratio) or "a" and "b" (of each side).

    Returns ``geomean_a``/``geomean_b`` (each side's mean over starts of its start means, as
    a geometric mean), ``estimate`` (log of their ratio), ``se``, ``df``, ``p`` (two-sided t,
    raw), ``change_pct``, ``starts_a``/``starts_b``, ``repeats_a``/``repeats_b`` (repeats in
    all), the measured ``components`` per side (and of the log-ratio when paired),
    ``higher_is_better`` and ``test``; ``verdict`` "n/a ..." when nothing measures the
    start-to-start noise (one start a side and no prior)."""
    la, lb = _logs(a), _logs(b)
    if not la or not lb:
        raise ValueError(f"compare needs values on both sides, got {len(la)} and {len(lb)} starts")
    prior = prior or {}
    mean_a, var_a, df_a = start_means_variance(la, prior.get("a"))
    mean_b, var_b, df_b = start_means_variance(lb, prior.get("b"))
    out = {
        "geomean_a": math.exp(mean_a),
        "geomean_b": math.exp(mean_b),
        "estimate": mean_b - mean_a,
        "change_pct": 100 * math.expm1(mean_b - mean_a),
        "starts_a": len(la),
        "starts_b": len(lb),
        "repeats_a": sum(len(g) for g in la),
        "repeats_b": sum(len(g) for g in lb),
        "components": {"a": components(la).to_json(), "b": components(lb).to_json()},
        "higher_is_better": higher_is_better,
        "test": PAIRED if paired else UNPAIRED,
        "se": NAN,
        "df": 0,
        "p": NAN,
    }
    used = [prior.get(k) for k in (("d",) if paired else ("a", "b"))]
    out["prior_df"] = max((p.df_between for p in used if p is not None), default=0)
    if paired:
        if [len(g) for g in la] != [len(g) for g in lb]:
            raise ValueError("a paired comparison needs the same repeats per start a side")
        d = [y - x for x, y in zip(la, lb, strict=True)]
        out["components"]["d"] = components(d).to_json()
        _, var, df = start_means_variance(d, prior.get("d"))
        var_est = var / len(d) if df else NAN
    else:
        var_est, df = _welch(var_a, len(la), df_a, var_b, len(lb), df_b)
    if not df:
        out["verdict"] = ONE_START
        return out
    se = math.sqrt(var_est)
    out["se"], out["df"] = se, df
    if se == 0:
        out["p"] = 1.0 if out["estimate"] == 0 else 0.0
    else:
        out["p"] = float(2 * sps.t.sf(abs(out["estimate"]) / se, df))
    return out


def _welch(var_a: float, k_a: int, df_a: int, var_b: float, k_b: int, df_b: int):
    """(variance of the difference of the two sides' means over starts, Welch-Satterthwaite
    degrees of freedom); (NaN, 0) when either side has no estimate."""
    if not df_a or not df_b:
        return NAN, 0
    va, vb = var_a / k_a, var_b / k_b
    total = va + vb
    if total == 0:
        return 0.0, df_a + df_b
    return total, float(total**2 / (va**2 / df_a + vb**2 / df_b))


def as_pct(log_change: float) -> float:
    """A log-scale change in %; beyond float range, infinite (a look with almost no data)."""
    with np.errstate(over="ignore"):
        return float(100 * np.expm1(log_change))


def mdc_pct(se: float, df: float, level: float, power: float = POWER) -> float:
    """The smallest change (in %) a two-sided t test at ``level`` detects with probability
    ``power``, for an estimate with standard error ``se`` (log units) on ``df`` degrees of
    freedom: exp(delta se) - 1 with delta the noncentrality at which the noncentral t
    reaches that power (exact for the t test; the usual t_{1-level/2} + t_power is
    optimistic at few degrees of freedom)."""
    if not df or math.isnan(se):
        return math.inf
    if se == 0:
        return 0.0
    q = float(sps.t.isf(level / 2, df))

    def short(delta: float) -> float:
        return float(sps.nct.sf(q, df, delta) + sps.nct.cdf(-q, df, delta)) - power

    approx = q + float(sps.t.ppf(power, df))  # brackets the root from above at few df
    high = approx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        while short(high) < 0 and high < 4 * approx:
            high *= 1.25
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        value = short(high)
    if math.isnan(value) or value < 0:  # the noncentral t out of numerical reach
        return as_pct(approx * se)
    try:
        with warnings.catch_warnings():  # scipy's series warnings at extreme noncentrality
            warnings.simplefilter("ignore", RuntimeWarning)
            delta = optimize.brentq(short, 0.0, high, xtol=1e-6)
    except ValueError:  # NaN inside the bracket: scipy's noncentral t at its limits
        delta = approx
    return as_pct(delta * se)


def judge(
    row: dict, level: float, margin_pct: float, alpha: float = ALPHA, *, with_mdc: bool = True
) -> dict:
    """A tested row (``compare``'s) judged at two-sided ``level``: ``ci_low``/``ci_high``
    (the change's t interval at confidence 1 - level, in %), ``p_adj`` (p * alpha / level,
    capped at 1: below alpha exactly when the interval excludes no change), ``mdc_pct``,
    ``level`` and ``verdict``."""
    est, se, df = row["estimate"], row["se"], row["df"]
    q = float(sps.t.ppf(1 - level / 2, df)) if se > 0 else 0.0
    lo, hi = est - q * se, est + q * se
    code = int(judge_arrays(np.asarray(est), np.asarray(se), np.asarray(df),
                            np.asarray(row["higher_is_better"]), level, margin_pct))  # fmt: skip
    verdict = CODES[code]
    return {
        **row,
        "level": level,
        "ci_low": as_pct(lo),
        "ci_high": as_pct(hi),
        "p_adj": min(1.0, row["p"] * alpha / level),
        "mdc_pct": mdc_pct(se, df, level) if with_mdc else NAN,
        "verdict": verdict,
    }


def testable(row: Mapping) -> bool:
    return not str(row.get("verdict", "")).startswith("n/a") and bool(row.get("df"))


def verdicts(
    rows: Sequence[dict], *, margin_pct: float = DEFAULT_MARGIN_PCT, alpha: float = ALPHA
) -> list[dict]:
    """Every tested row of one table judged at alpha / m (m: the tested rows), or at its
    own ``level`` where a sequential design set one; untested rows keep their "n/a"."""
    if not 0 < margin_pct < 100:
        raise ValueError(f"margin_pct must be above 0 and below 100, got {margin_pct}")
    m = sum(1 for r in rows if testable(r))
    out = []
    for r in rows:
        if not testable(r):
            out.append({**r, "verdict": r.get("verdict") or "n/a", "p_adj": NAN,
                        "ci_low": NAN, "ci_high": NAN, "mdc_pct": math.inf})  # fmt: skip
            continue
        out.append(judge(r, r.get("level") or alpha / m, margin_pct, alpha))
    return out


# --- the same rule on arrays, balanced: what the simulations run ---


def paired_arrays(
    a: np.ndarray, b: np.ndarray, prior_var: float | None = None, prior_df: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, se, df) of the paired rule on arrays (..., starts, repeats), balanced; a
    prior start-mean variance with ``prior_df`` degrees of freedom pools in as in
    ``start_means_variance``."""
    d = np.log(b) - np.log(a)
    means = d.mean(axis=-1)
    k = means.shape[-1]
    est = means.mean(axis=-1)
    var_d = means.var(axis=-1, ddof=1) if k > 1 else np.full(est.shape, np.nan)
    prior = np.nan if prior_var is None else prior_var
    var, df = pooled_variance(var_d, k - 1, prior, prior_df if prior_var is not None else 0)
    return est, np.sqrt(var / k), np.full(est.shape, df, float)


def judge_arrays(
    est: np.ndarray,
    se: np.ndarray,
    df: np.ndarray,
    higher: np.ndarray,
    level: np.ndarray | float,
    margin_pct: float,
) -> np.ndarray:
    """``judge`` on arrays: codes +1 better, -1 worse, 0 inconclusive, 2 equivalent."""
    q = np.where(se > 0, sps.t.ppf(1 - np.asarray(level) / 2, df), 0.0)
    lo, hi = est - q * se, est + q * se
    # +-margin on the % scale the interval is shown on: log(1 - m) .. log(1 + m)
    inside = (lo > math.log1p(-margin_pct / 100)) & (hi < math.log1p(margin_pct / 100))
    changed = ((lo > 0) | (hi < 0)) & ~inside
    better = (est > 0) == np.asarray(higher, bool)
    code = np.where(changed, np.where(better, 1, -1), np.where(inside, 2, 0))
    return code.astype(np.int8)


def fixed_verdicts(
    a: np.ndarray,
    b: np.ndarray,
    higher: np.ndarray,
    *,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    alpha: float = ALPHA,
    prior_var: float | None = None,
    prior_df: int = 0,
) -> np.ndarray:
    """``compare`` (paired) + ``verdicts`` on arrays (tables, rows, starts, repeats): one
    Bonferroni family per table. A unit test holds this equal to the scalar path."""
    est, se, df = paired_arrays(a, b, prior_var, prior_df)
    rows = a.shape[-3]
    higher = np.broadcast_to(np.asarray(higher, bool), est.shape)
    return judge_arrays(est, se, df, higher, alpha / rows, margin_pct)


# --- prior components from earlier runs ---


def point_key(point: Mapping) -> tuple:
    """A grid point's identity in bench.json: ISL, OSL and its load (concurrency, or rate)."""
    load = point.get("max_concurrency")
    if point.get("request_rate") not in (None, "inf", math.inf):
        load = f"rate {point['request_rate']}"
    return int(point["isl"]), int(point["osl"]), load


def by_start(points: Iterable[Mapping], metric: str) -> dict[int, dict[int, float]]:
    """A side's values of ``metric`` per start and repeat (points without ``start``, measured
    before starts were the unit, count as start 0); invalid or missing values left out."""
    out: dict[int, dict[int, float]] = {}
    for p in points:
        value = p.get(metric)
        if p.get("invalid") or not isinstance(value, (int, float)) or not value > 0:
            continue
        out.setdefault(int(p.get("start") or 0), {})[int(p["repeat"])] = float(value)
    return out


def prior_from_benches(
    pairs: Iterable[tuple[Path, Path]], metrics: Iterable[str]
) -> dict[tuple, dict[str, Components]]:
    """Components of earlier runs of one cell (model, image, layout), from their bench.json
    files: ``pairs`` gives per run side A's and side B's file (the two arms' files of one
    pair job, say). Per (point key, metric): "a" and "b" (each side's) and "d" (the paired
    log-ratio's, for runs whose sides carry the same starts and repeats), pooled over the
    runs; runs with a single start contribute their within-start part only. The loader hook
    ``comparison.compare_serve(priors=...)`` takes."""
    metrics = list(metrics)
    found: dict[tuple, dict[str, list[Components]]] = {}
    for path_a, path_b in pairs:
        bench_a, bench_b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
        keys = {point_key(p) for p in bench_a["points"]} & {point_key(p) for p in bench_b["points"]}
        for key in keys:
            pa = [p for p in bench_a["points"] if point_key(p) == key]
            pb = [p for p in bench_b["points"] if point_key(p) == key]
            for metric in metrics:
                sa, sb = by_start(pa, metric), by_start(pb, metric)
                slot = found.setdefault((key, metric), {"a": [], "b": [], "d": []})
                for side, values in (("a", sa), ("b", sb)):
                    if values:
                        slot[side].append(components(_log_groups(values)))
                d = [
                    [math.log(sb[k][r] / sa[k][r]) for r in sorted(sa[k].keys() & sb[k].keys())]
                    for k in sorted(sa.keys() & sb.keys())
                ]
                if any(d):
                    slot["d"].append(components(d))
    return {key: {side: pool(parts) for side, parts in slot.items() if parts}
            for key, slot in found.items()}  # fmt: skip


def _log_groups(values: Mapping[int, Mapping[int, float]]) -> list[list[float]]:
    return [[math.log(v) for v in values[k].values()] for k in sorted(values)]
