"""The statistics behind every comparison in the report: repeated serving measurements (two
samples of repeats) and GSM8K accuracy (two runs over the same questions).

Pure functions on plain numbers; ``cellbench.stats.comparison`` applies them to the tidy frames.

Serving: a metric's repeats on side A and side B are compared pairwise where they were
measured as interleaved pairs (the t-test of the log-ratios of the pairs), else with Welch's
t-test (unequal variances; repeats are few, so the t distribution, not the normal one). The
p-values of one table are Holm-adjusted together, and a verdict is "better" or "worse" only
when the adjusted p-value is below ``alpha`` *and* the change is at least ``min_change_pct``.
The floor exists because the repeats of one run share one server start, one warm cache and
one machine state: their spread understates the difference between two separate starts of the
very same server (vLLM issue 39903 reports this for accuracy; latency behaves the same way).
The report also counts the floor as the spread of that difference inside each test
(``restart_pct``), so a change is called only when it stands out from restart noise too.
The default floor is measured: ``benchmarks/noise_models.py`` on the committed H200 runs
(``benchmarks/results/noise_models_2026-12-05.md``), the largest per-metric standard deviation
of the difference between two server starts. ``tests/unit/test_calibration.py`` simulates the
resulting false-change rate and power on the fitted noise models.

GSM8K: the two runs answer the same questions, so they are compared per question (McNemar on
the questions they disagree on, with the mid-p value that holds its nominal rate without the
exact test's loss of power; Fagerland, Lydersen and Laake 2013), with a paired bootstrap
interval for the accuracy difference. Only where questions cannot be matched is the unpaired
two-proportion test used, and its result says so.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
# sqrt(2) x the largest server-start spread of the H200 noise models (noise.floor_pct), rounded up:
# benchmarks/results/noise_models_2026-12-05.md (was 2.0, quoted from an issue, unmeasured).
DEFAULT_MIN_CHANGE_PCT = 10.0
ONE_RUN = "n/a (one run a side)"
BETTER, WORSE, NOISE = "better", "worse", "within noise"
NAN = float("nan")
# The two serving tests: two samples of repeats, or the log-ratios of interleaved pairs.
WELCH, PAIRED = "welch", "paired"


def _isnan(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def compare_metric(
    a: Sequence[float],
    b: Sequence[float],
    *,
    higher_is_better: bool,
    confidence: float = 0.95,
    paired: bool = False,
    restart_pct: float = 0.0,
) -> dict:
    """One metric's repeats on side A against side B.

    Returns ``median_a``, ``median_b``, ``change_pct`` (B's median against A's, in % of A's
    median), ``ci_low``/``ci_high`` (a ``confidence`` interval for the change in %: Welch's
    t-interval for mean(B) - mean(A), with Welch-Satterthwaite degrees of freedom, divided by
    mean(A); the uncertainty of that denominator is left out, which is second order while the
    spread is a few % of the mean), ``p`` (Welch's two-sided p-value, raw), ``n_a``, ``n_b``,
    ``cv_a``/``cv_b`` (sample standard deviation in % of the mean), ``mean_change_pct`` and
    ``higher_is_better``. With three repeats a side the t quantile is large (about 4.3 at two
    degrees of freedom) and the interval wide: that is what three repeats can say.

    Fewer than two repeats on a side: no spread, so no p-value and no interval; ``verdict`` is
    then already set to "n/a (one run a side)". Both sides without any spread: p is 1 when
    their values are equal and 0 otherwise (the difference is then exact, not estimated).

    ``paired``: ``a[k]`` and ``b[k]`` were measured as one interleaved pair (same prompts,
    minutes apart), so what they share cancels in their ratio: the test is then the one-sample
    t-test of log(b[k] / a[k]) (n - 1 degrees of freedom), ``change_pct`` and the interval are
    that mean log-ratio's (a geometric-mean change), and ``test`` says "paired". On the
    committed H200 runs what a pair shares was 2-6 times a measurement's own spread
    (``benchmarks/results/noise_models_2026-12-05.md``), which Welch's test counts as noise.
    Needs as many values on each side, none missing and all positive.

    ``restart_pct``: the spread (standard deviation, % of the level) of the difference between
    two starts of the same server, which no number of repeats inside one run can see (each
    side's repeats share one start). Its variance is added to the change's, with infinite
    degrees of freedom in the Welch-Satterthwaite sum, so the test asks whether the change is
    beyond restart noise as well as beyond the repeats' spread. 0 (the default) leaves it out.
    """
    if not restart_pct >= 0:
        raise ValueError(f"restart_pct must be a number >= 0, got {restart_pct}")
    if paired:
        return _compare_paired(a, b, higher_is_better, confidence, restart_pct)
    va = np.asarray([float(x) for x in a if not _isnan(x)])
    vb = np.asarray([float(x) for x in b if not _isnan(x)])
    if not len(va) or not len(vb):
        raise ValueError(f"compare_metric needs values on both sides, got {len(va)} and {len(vb)}")
    med_a, med_b = float(np.median(va)), float(np.median(vb))
    mean_a, mean_b = float(va.mean()), float(vb.mean())
    out = {
        "median_a": med_a,
        "median_b": med_b,
        "change_pct": 100 * (med_b - med_a) / med_a if med_a else NAN,
        "mean_change_pct": 100 * (mean_b - mean_a) / mean_a if mean_a else NAN,
        "ci_low": NAN,
        "ci_high": NAN,
        "p": NAN,
        "n_a": len(va),
        "n_b": len(vb),
        "cv_a": _cv(va),
        "cv_b": _cv(vb),
        "higher_is_better": higher_is_better,
        "test": WELCH,
    }
    if len(va) < 2 or len(vb) < 2:
        out["verdict"] = ONE_RUN
        return out
    var_a, var_b = va.var(ddof=1) / len(va), vb.var(ddof=1) / len(vb)
    var_r = (restart_pct / 100 * mean_a) ** 2
    se = math.sqrt(var_a + var_b + var_r)
    diff = mean_b - mean_a
    if se == 0:
        out["p"] = 1.0 if diff == 0 else 0.0
        if mean_a:
            out["ci_low"] = out["ci_high"] = 100 * diff / mean_a
        return out
    df = float(_welch_df(var_a, len(va) - 1, var_b, len(vb) - 1, var_r))
    t = diff / se
    out["p"] = float(2 * sps.t.sf(abs(t), df))
    if mean_a:
        half = float(sps.t.ppf(0.5 + confidence / 2, df)) * se
        lo, hi = 100 * (diff - half) / mean_a, 100 * (diff + half) / mean_a
        out["ci_low"], out["ci_high"] = min(lo, hi), max(lo, hi)
    return out


def _compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    higher_is_better: bool,
    confidence: float,
    restart_pct: float,
) -> dict:
    va, vb = np.asarray(a, float), np.asarray(b, float)
    if va.shape != vb.shape or not len(va):
        raise ValueError(
            f"a paired comparison needs as many values a side, got {len(va)}, {len(vb)}"
        )
    if not (np.isfinite(va).all() and np.isfinite(vb).all() and (va > 0).all() and (vb > 0).all()):
        raise ValueError("a paired comparison needs finite positive values on both sides")
    d = np.log(vb) - np.log(va)
    n = len(d)
    out = {
        "median_a": float(np.median(va)),
        "median_b": float(np.median(vb)),
        "change_pct": float(100 * np.expm1(d.mean())),
        "mean_change_pct": float(100 * (vb.mean() - va.mean()) / va.mean()),
        "ci_low": NAN,
        "ci_high": NAN,
        "p": NAN,
        "n_a": n,
        "n_b": n,
        "cv_a": _cv(va),
        "cv_b": _cv(vb),
        "cv_pair": float(100 * d.std(ddof=1)) if n > 1 else NAN,
        "higher_is_better": higher_is_better,
        "test": PAIRED,
    }
    if n < 2:
        out["verdict"] = ONE_RUN
        return out
    var_d = float(d.var(ddof=1)) / n
    var_r = math.log1p(restart_pct / 100) ** 2
    se = math.sqrt(var_d + var_r)
    if se == 0:
        out["p"] = 1.0 if d.mean() == 0 else 0.0
        out["ci_low"] = out["ci_high"] = out["change_pct"]
        return out
    df = float(_df_known(var_d, n - 1, var_r))
    out["p"] = float(2 * sps.t.sf(abs(d.mean()) / se, df))
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * se
    out["ci_low"] = float(100 * np.expm1(d.mean() - half))
    out["ci_high"] = float(100 * np.expm1(d.mean() + half))
    return out


def _upper(var, df: int):
    """A 95% upper bound of a variance estimated with ``df`` degrees of freedom."""
    return var * df / sps.chi2.ppf(0.05, df)


def _df_known(var, df: int, var_known):
    """Degrees of freedom of (estimated ``var`` + known ``var_known``) by Welch-Satterthwaite,
    with the estimate at its 95% upper bound: fed the estimate itself, a few repeats that
    happen to agree make the sum look known and the test too sure (on the H200 noise model
    14-24% of simulated A/A tables at 3 pairs called a change; with the bound, none)."""
    up = _upper(var, df)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(up > 0, (up + var_known) ** 2 * df / np.where(up > 0, up, 1) ** 2, np.inf)


def _welch_df(var_a, df_a: int, var_b, df_b: int, var_known):
    """``_df_known`` for Welch's two estimated variances."""
    up_a, up_b = _upper(var_a, df_a), _upper(var_b, df_b)
    measured = up_a**2 / df_a + up_b**2 / df_b
    with np.errstate(divide="ignore", invalid="ignore"):
        total = (up_a + up_b + var_known) ** 2
        return np.where(measured > 0, total / np.where(measured > 0, measured, 1), np.inf)


def _cv(values: np.ndarray) -> float:
    if len(values) < 2 or not values.mean():
        return NAN
    return float(100 * values.std(ddof=1) / abs(values.mean()))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN and does not count as a test): a table
    tests many metrics and points at once, and without this about one row in twenty would
    read as a change from noise alone."""
    order = sorted(range(len(p_values)), key=lambda i: (_isnan(p_values[i]), p_values[i]))
    m = sum(1 for p in p_values if not _isnan(p))
    adjusted = [NAN] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        if _isnan(p_values[i]):
            continue
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def verdicts(
    results: Sequence[dict],
    *,
    min_change_pct: float = DEFAULT_MIN_CHANGE_PCT,
    alpha: float = ALPHA,
) -> list[dict]:
    """``compare_metric`` results of one table, each copied with ``p_holm`` (Holm over the
    table) and ``verdict``: "better" or "worse" (by the metric's direction) when the adjusted
    p-value is below ``alpha``, the median change is at least ``min_change_pct`` in size, and
    the means moved the same way as the medians; "within noise" otherwise; results that could
    not be tested keep their "n/a" verdict."""
    if min_change_pct < 0:
        raise ValueError(f"min_change_pct must be >= 0, got {min_change_pct}")
    adjusted = holm([r["p"] for r in results])
    out = []
    for r, p in zip(results, adjusted, strict=True):
        r = {**r, "p_holm": p}
        if r.get("verdict", "").startswith("n/a") or _isnan(p) or _isnan(r["change_pct"]):
            r["verdict"] = r.get("verdict") or "n/a"
        else:
            change, mean_change = r["change_pct"], r["mean_change_pct"]
            # Welch's verdict needs medians and means to agree; the paired change is one figure.
            same_way = r.get("test") == PAIRED or change * mean_change > 0
            if p < alpha and abs(change) >= min_change_pct and same_way:
                up = change > 0
                r["verdict"] = BETTER if up == r["higher_is_better"] else WORSE
            else:
                r["verdict"] = NOISE
        out.append(r)
    return out


def repeats_needed(
    cv_pct: float, change_pct: float, alpha: float = ALPHA, power: float = 0.8
) -> int:
    """Repeats a side for a two-sided Welch/t test at level ``alpha`` to see a change of
    ``change_pct`` (in % of the mean) with probability ``power``, when one repeat's spread is
    ``cv_pct`` (% of the mean) on both sides. The normal-approximation sample size
    n = 2 (z_a + z_b)^2 (cv / change)^2, with the z quantiles replaced by t quantiles at
    2n - 2 degrees of freedom and solved by counting up, so small n is not flattered. At least
    2 (one repeat has no spread to test against). The Holm adjustment of a table asks for more
    than this when many rows are tested; the floor ``min_change_pct`` is separate."""
    if cv_pct < 0 or change_pct == 0 or _isnan(cv_pct) or _isnan(change_pct):
        raise ValueError(f"need cv_pct >= 0 and a non-zero change_pct, got {cv_pct}, {change_pct}")
    ratio = (cv_pct / abs(change_pct)) ** 2
    n = 2
    while n < 100_000:
        df = 2 * n - 2
        q = sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(power, df)
        if 2 * q * q * ratio <= n:
            return n
        n += 1
    return n


def mcnemar(fixed: int, broken: int) -> tuple[float, float]:
    """(exact, mid-p) two-sided McNemar p-values from the discordant counts. With
    k = min(fixed, broken) of m = fixed + broken and X ~ Binomial(m, 1/2): exact p =
    min(1, 2 P(X <= k)); mid-p = 2 P(X <= k) - P(X = k), i.e. the exact p counting only half of
    the observed split's own probability. No discordant questions: both are 1."""
    m = fixed + broken
    if m == 0:
        return 1.0, 1.0
    k = min(fixed, broken)
    tail = float(sps.binom.cdf(k, m, 0.5))
    point = float(sps.binom.pmf(k, m, 0.5))
    return min(1.0, 2 * tail), min(1.0, 2 * tail - point)


def paired_accuracy(
    a: Mapping[Hashable, bool],
    b: Mapping[Hashable, bool],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = ALPHA,
    confidence: float = 0.95,
) -> dict:
    """Two runs' per-question correctness, paired on the questions both answered.

    Returns ``n`` (questions paired), ``only_a``/``only_b`` (questions one side lacks),
    ``both_right``, ``both_wrong``, ``fixed`` (wrong in A, right in B), ``broken`` (right in A,
    wrong in B), ``acc_a``, ``acc_b``, ``diff`` (acc_b - acc_a), ``p_exact`` and ``p_mid``
    (McNemar), ``ci_low``/``ci_high`` (percentile interval of the difference over ``n_boot``
    resamples of the questions, drawn with replacement: each resample's four counts are one
    multinomial draw with the observed shares, which is the same thing), and ``verdict``:
    "better"/"worse" when mid-p < ``alpha`` (by the sign of the difference), else
    "within noise"."""
    common = a.keys() & b.keys()
    if not common:
        raise ValueError("paired_accuracy: the two runs share no question")
    counts = {"both_right": 0, "both_wrong": 0, "fixed": 0, "broken": 0}
    for key in common:
        ra, rb = bool(a[key]), bool(b[key])
        name = ("both_right" if rb else "broken") if ra else ("fixed" if rb else "both_wrong")
        counts[name] += 1
    n = len(common)
    fixed, broken = counts["fixed"], counts["broken"]
    p_exact, p_mid = mcnemar(fixed, broken)
    rng = np.random.default_rng(seed)
    shares = np.array([counts[k] for k in ("both_right", "both_wrong", "fixed", "broken")]) / n
    draws = rng.multinomial(n, shares, size=n_boot)
    boot = (draws[:, 2] - draws[:, 3]) / n
    tail = (1 - confidence) / 2
    diff = (fixed - broken) / n
    if p_mid < alpha and diff != 0:
        verdict = BETTER if diff > 0 else WORSE
    else:
        verdict = NOISE
    return {
        "paired": True,
        "n": n,
        "only_a": len(a.keys() - common),
        "only_b": len(b.keys() - common),
        **counts,
        "acc_a": (counts["both_right"] + broken) / n,
        "acc_b": (counts["both_right"] + fixed) / n,
        "diff": diff,
        "p_exact": p_exact,
        "p_mid": p_mid,
        "ci_low": float(np.quantile(boot, tail)),
        "ci_high": float(np.quantile(boot, 1 - tail)),
        "verdict": verdict,
    }


def unpaired_accuracy(
    acc_a: float,
    n_a: int,
    acc_b: float,
    n_b: int,
    *,
    alpha: float = ALPHA,
    confidence: float = 0.95,
) -> dict:
    """Two accuracies whose questions cannot be matched: the two-proportion z-test (pooled
    standard error under no change), with a normal interval for the difference from the
    unpooled standard error. On runs that share questions this ignores their agreement and
    loses power; use ``paired_accuracy`` wherever pairing exists. The result says
    ``paired: False``."""
    if n_a <= 0 or n_b <= 0:
        raise ValueError(f"unpaired_accuracy needs questions on both sides, got {n_a}, {n_b}")
    diff = acc_b - acc_a
    pooled = (acc_a * n_a + acc_b * n_b) / (n_a + n_b)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    se = math.sqrt(acc_a * (1 - acc_a) / n_a + acc_b * (1 - acc_b) / n_b)
    if se0 == 0:
        p = 1.0 if diff == 0 else 0.0
    else:
        p = float(2 * sps.norm.sf(abs(diff) / se0))
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    verdict = (BETTER if diff > 0 else WORSE) if p < alpha and diff != 0 else NOISE
    return {
        "paired": False,
        "n_a": n_a,
        "n_b": n_b,
        "acc_a": acc_a,
        "acc_b": acc_b,
        "diff": diff,
        "stderr": se,
        "p": p,
        "ci_low": diff - z * se,
        "ci_high": diff + z * se,
        "verdict": verdict,
        "note": "unpaired: the two runs' questions could not be matched",
    }


# --- the same verdicts on arrays: what the calibration simulates (issue 32 item 2) ---


def holm_array(p: np.ndarray) -> np.ndarray:
    """``holm`` along the last axis of ``p`` (no NaN): one adjusted p-value per test, each
    family (all leading indices) adjusted on its own."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1)
    scaled = np.minimum(1.0, (m - np.arange(m)) * ranked)
    scaled = np.maximum.accumulate(scaled, axis=-1)
    out = np.empty_like(scaled)
    np.put_along_axis(out, order, scaled, axis=-1)
    return out


def table_verdicts(
    a: np.ndarray,
    b: np.ndarray,
    higher_is_better: np.ndarray | bool,
    *,
    test: str = WELCH,
    min_change_pct: float = DEFAULT_MIN_CHANGE_PCT,
    restart_pct: float | None = None,
    alpha: float = ALPHA,
) -> np.ndarray:
    """The report's serving verdicts on arrays of shape (..., rows, repeats), one Holm
    family per table (the rows axis): +1 better, -1 worse, 0 within noise. ``test`` is
    ``compare_metric``'s (welch: the two sides' repeats as two samples; paired: the log
    ratio of repeat k of B to repeat k of A). A test checks that this equals
    ``compare_metric`` + ``verdicts`` on the same numbers, so simulating this simulates the
    report. ``restart_pct`` as in ``compare_metric``; None: the floor, as the report uses it."""
    restart = min_change_pct if restart_pct is None else restart_pct
    a, b = np.asarray(a, float), np.asarray(b, float)
    n_a, n_b = a.shape[-1], b.shape[-1]
    if n_a < 2 or n_b < 2:
        raise ValueError(f"table_verdicts needs 2 repeats a side or more, got {n_a} and {n_b}")
    higher = np.broadcast_to(np.asarray(higher_is_better, bool), a.shape[:-1])
    if test == PAIRED:
        change, p = _paired_arrays(a, b, restart)
        same_way = np.ones(change.shape, bool)
    elif test == WELCH:
        med_a, med_b = np.median(a, axis=-1), np.median(b, axis=-1)
        mean_a, mean_b = a.mean(axis=-1), b.mean(axis=-1)
        change = 100 * (med_b - med_a) / med_a
        same_way = change * (mean_b - mean_a) > 0
        va, vb = a.var(axis=-1, ddof=1) / n_a, b.var(axis=-1, ddof=1) / n_b
        vr = (restart / 100 * mean_a) ** 2
        se = np.sqrt(va + vb + vr)
        diff = mean_b - mean_a
        with np.errstate(divide="ignore", invalid="ignore"):
            p = 2 * sps.t.sf(np.abs(diff / se), _welch_df(va, n_a - 1, vb, n_b - 1, vr))
        p = np.where(se == 0, np.where(diff == 0, 1.0, 0.0), p)
    else:
        raise ValueError(f"test must be {WELCH!r} or {PAIRED!r}, got {test!r}")
    adjusted = holm_array(p)
    called = (adjusted < alpha) & (np.abs(change) >= min_change_pct) & same_way
    up = change > 0
    return np.where(called, np.where(up == higher, 1, -1), 0).astype(np.int8)


def _paired_arrays(
    a: np.ndarray, b: np.ndarray, restart_pct: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(change in %, two-sided p) of the paired log-ratio test along the last axis."""
    if a.shape != b.shape:
        raise ValueError(f"a paired test needs as many repeats on each side: {a.shape}, {b.shape}")
    d = np.log(b) - np.log(a)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    var_d = d.var(axis=-1, ddof=1) / n
    var_r = math.log1p(restart_pct / 100) ** 2
    se = np.sqrt(var_d + var_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2 * sps.t.sf(np.abs(mean / se), _df_known(var_d, n - 1, var_r))
    p = np.where(se == 0, np.where(mean == 0, 1.0, 0.0), p)
    return 100 * np.expm1(mean), p


def pairs_needed(
    cv_pair_pct: float,
    change_pct: float,
    restart_pct: float = 0.0,
    *,
    alpha: float = ALPHA,
    power: float = 0.8,
    limit: int = 10_000,
) -> int | None:
    """Interleaved pairs for the paired test (``compare_metric(paired=True)``) to call a change
    of ``change_pct`` with probability ``power`` at level ``alpha`` (one test, before Holm),
    when the log-ratio of one pair has standard deviation ``cv_pair_pct`` / 100 (``cv_pair`` of
    a paired result) and two server starts differ by ``restart_pct`` %: the smallest n with
    (t_{1-alpha/2} + t_power) * sqrt(cv^2 / n + r^2) <= |log(1 + change)|, t at n - 1 degrees of
    freedom. None when no n up to ``limit`` does: restart noise alone is then too large for one
    run to tell this change, however many pairs it measures."""
    if not cv_pair_pct >= 0 or not restart_pct >= 0 or change_pct == 0 or _isnan(change_pct):
        raise ValueError(
            f"need cv_pair_pct >= 0, restart_pct >= 0 and a non-zero change_pct, got "
            f"{cv_pair_pct}, {restart_pct}, {change_pct}"
        )
    target = abs(math.log1p(change_pct / 100))
    cv2 = (cv_pair_pct / 100) ** 2
    r2 = math.log1p(restart_pct / 100) ** 2
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    if z * math.sqrt(r2) >= target:
        return None
    n = 2
    while n <= limit:
        q = sps.t.ppf(1 - alpha / 2, n - 1) + sps.t.ppf(power, n - 1)
        if q * math.sqrt(cv2 / n + r2) <= target:
            return n
        n += 1
    return None
