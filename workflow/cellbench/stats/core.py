"""The statistics behind the GSM8K comparisons in the report (two runs over the same
questions), and the constants every verdict shares.

Serving comparisons are ``cellbench.stats.starts``' (server starts as the unit of
replication, variance components from the data) and ``cellbench.stats.sequential``'s.

GSM8K: the two runs answer the same questions, so they are compared per question (McNemar on
the questions they disagree on, with the mid-p value that holds its nominal rate without the
exact test's loss of power; Fagerland, Lydersen and Laake 2013), with a paired bootstrap
interval for the accuracy difference. Only where questions cannot be matched is the unpaired
two-proportion test used, and its result says so. A difference that is not significant is
"inconclusive": GSM8K has no equivalence margin, so nothing is called equivalent there.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
# report.min_change_pct: the smallest change worth calling, the equivalence margin.
DEFAULT_MIN_CHANGE_PCT = 2.0
BETTER, WORSE, NOISE = "better", "worse", "inconclusive"
NAN = float("nan")


def _isnan(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


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
    "inconclusive"."""
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
