"""Server starts that stop once the answer is known: a group-sequential design over starts.

A two-sided serve job measures its points in rounds (a fresh server per side each round, see
``cellbench.serve.repeat_stop``). After each round from the minimum on, every row (point x
metric) still open is looked at; a point takes another round while any of its rows is open,
up to the cap. Each look is a look of a group-sequential test:

- **changed** (better / worse): the row's p-value (``starts.compare``, paired by start) is
  below the look's nominal level. The levels come from the Lan-DeMets alpha-spending
  function of O'Brien-Fleming type (``obf_spent``; a / 2 a side), at the
  information fractions t = starts / cap, with a = alpha / rows (Bonferroni over the
  table's rows). Boundaries are solved for the correlated looks (corr(Z_i, Z_j) =
  sqrt(t_i / t_j)) with scipy's multivariate normal, so the chance of crossing at any look
  under no change is a, not a union bound's over-charge. The t statistic is compared with
  the normal boundary's nominal p-value (the usual nominal-level approach for unknown
  variance). The interval shown is the repeated confidence interval at the same level, so
  verdict, interval and p agree at every look.
- **equivalent**: that interval lies inside +-margin (``report.min_change_pct``).
- **futile**: the conditional power to cross by the cap, under the trend seen so far, is
  below ``futility_power``. Non-binding: the boundaries are computed as if it never stopped
  anything, so it cannot raise the false-change rate; the row ends inconclusive (or
  equivalent when its interval is inside the margin) with the change it could have seen.
- **cap reached**: the last look came first; the verdict at its level.

``decide`` is what the serve stage calls per point after each round; ``simulate`` is the same
rule on arrays (a test holds the two equal) for the simulations and the benchmark.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as sps

from cellbench.stats import starts

CONTINUE = "continue"
CHANGED, EQUIVALENT, FUTILE, CAP = "changed", "equivalent", "futile", "cap reached"
INVALID = "too many invalid repeats"
SETTLED_STATUSES = (CHANGED, EQUIVALENT, FUTILE)
SETTLED = "settled"


def obf_spent(t: np.ndarray | float, alpha: float) -> np.ndarray:
    """Lan-DeMets O'Brien-Fleming-type two-sided alpha spent by information fraction ``t``:
    alpha / 2 a side, each side 2 - 2 Phi(z_{1-alpha/4} / sqrt(t)) (the convention of the
    published tables: K = 5 equal looks at alpha 0.05 give 4.877, 3.357, 2.680, 2.290,
    2.031)."""
    t = np.asarray(t, float)
    return 2 * (2 - 2 * sps.norm.cdf(sps.norm.isf(alpha / 4) / np.sqrt(t)))


@functools.lru_cache(maxsize=256)
def nominal_levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided nominal p-value per look: boundary c_k solves P(|Z_j| < c_j for j < k,
    |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}) under no change, Z the looks' correlated
    normal statistics (corr(Z_i, Z_j) = sqrt(t_i / t_j)). Computed by the recursive numerical
    integration of Armitage, McPherson and Rowe (Jennison and Turnbull, ch. 19) on the score
    process B_k = Z_k sqrt(t_k), whose increments are independent; a unit test checks it
    against scipy's multivariate normal integral of the same looks."""
    t = np.asarray(fractions, float)
    if not (np.all(np.diff(t) > 0) and 0 < t[0] and t[-1] <= 1 + 1e-12):
        raise ValueError(f"information fractions must rise in (0, 1], got {fractions}")
    spent = obf_spent(t, alpha)
    levels: list[float] = []
    grid, density = None, None  # the sub-density of B over the continuation region so far
    for k in range(len(t)):
        share = float(spent[k] - (spent[k - 1] if k else 0.0))
        step = t[k] - (t[k - 1] if k else 0.0)
        if k == 0:
            c = float(sps.norm.isf(share / 2)) if share > 0 else 40.0
        else:

            def crossed(c: float, k=k, step=step, grid=grid, density=density, share=share):
                edge = c * math.sqrt(t[k])
                sd = math.sqrt(step)
                out = sps.norm.sf((edge - grid) / sd) + sps.norm.cdf((-edge - grid) / sd)
                return float(np.trapezoid(density * out, grid)) - share

            c = float(optimize.brentq(crossed, 0.0, 40.0, xtol=1e-7)) if share > 0 else 40.0
        levels.append(float(2 * sps.norm.sf(c)) if share > 0 else 0.0)
        edge = c * math.sqrt(t[k])
        new_grid = np.linspace(-edge, edge, 801)
        if k == 0:
            density = sps.norm.pdf(new_grid, scale=math.sqrt(t[0]))
        else:
            kernel = sps.norm.pdf((new_grid[:, None] - grid[None, :]) / math.sqrt(step))
            density = np.trapezoid(kernel * density[None, :], grid, axis=1) / math.sqrt(step)
        grid = new_grid
    return tuple(levels)


def inside_probability(cov: np.ndarray, c: np.ndarray) -> float:
    """P(|Z_j| < c_j for all j), Z normal with covariance ``cov`` (scipy's integral): the
    check of ``nominal_levels``."""
    mvn = sps.multivariate_normal(mean=np.zeros(len(c)), cov=cov, abseps=1e-6, releps=1e-4)
    return float(mvn.cdf(c, lower_limit=-np.asarray(c), rng=np.random.default_rng(0)))


@dataclass(frozen=True)
class Design:
    """``rows``: tests of the table (points x metrics; Bonferroni family); ``cap``: most
    starts per side; ``min_starts``: fewest (2: one start has no start-to-start spread);
    ``margin_pct``: the equivalence margin; ``max_invalid``: invalid repeats a point may
    have before it stops with what it has."""

    rows: int
    cap: int
    min_starts: int = 2
    margin_pct: float = starts.DEFAULT_MARGIN_PCT
    alpha: float = starts.ALPHA
    max_invalid: int = 2
    futility: bool = True
    futility_power: float = 0.1
    spending: bool = True

    def __post_init__(self) -> None:
        if self.rows < 1 or self.min_starts < 2 or self.cap < self.min_starts:
            raise ValueError(
                f"need rows >= 1 and 2 <= min_starts <= cap, got rows={self.rows}, "
                f"min_starts={self.min_starts}, cap={self.cap}"
            )
        if not 0 < self.margin_pct < 100 or not 0 < self.alpha < 1:
            raise ValueError(
                f"need 0 < margin_pct < 100 and 0 < alpha < 1, got {self.margin_pct}, {self.alpha}"
            )

    @property
    def looks(self) -> tuple[int, ...]:
        return tuple(range(self.min_starts, self.cap + 1))

    def levels(self) -> dict[int, float]:
        """Nominal two-sided level per look (starts so far -> level)."""
        row_alpha = self.alpha / self.rows
        if not self.spending:  # each look at the full level: what spending exists to prevent
            return dict.fromkeys(self.looks, row_alpha)
        fractions = tuple(k / self.cap for k in self.looks)
        return dict(zip(self.looks, nominal_levels(fractions, row_alpha), strict=True))


@functools.lru_cache(maxsize=128)
def inflation(design: Design, power: float = starts.POWER, paths: int = 40_000) -> float:
    """How much larger a change the design needs than one fixed test at its cap (level
    alpha / rows) to reach ``power``: delta_seq / delta_fixed in normal theory, simulated on
    the looks' Brownian motion with the design's boundaries and futility rule (fixed seed).
    The spending and the futility stops cost a little power; this states what."""
    levels = design.levels()
    looks = np.asarray(design.looks, float)
    t = looks / design.cap
    rng = np.random.default_rng(0)
    steps = np.sqrt(np.diff(np.concatenate(([0.0], t))))
    walk = np.cumsum(rng.standard_normal((paths, len(t))) * steps, axis=1)
    bounds = sps.norm.isf(np.asarray([levels[int(k)] for k in looks]) / 2)

    def reached(delta: float) -> float:
        z = (walk + delta * t) / np.sqrt(t)
        open_ = np.ones(paths, bool)
        called = np.zeros(paths, bool)
        for i, look in enumerate(looks):
            cross = open_ & (np.abs(z[:, i]) >= bounds[i])
            called |= cross & (z[:, i] > 0)
            open_ &= ~cross
            open_ &= ~_futile(z[:, i], int(look), design, levels)
        return float(called.mean()) - power

    fixed = float(sps.norm.isf(design.alpha / design.rows / 2) + sps.norm.ppf(power))
    return float(optimize.brentq(reached, 0.0, 3 * fixed + 10, xtol=1e-4)) / fixed


def design_mdc_pct(row: Mapping, look: int, design: Design) -> float:
    """What a row's design could have seen: the fixed test's detectable change at the cap
    (level alpha / rows; the data's standard error projected from ``look`` starts to the
    cap, its degrees of freedom grown by the starts to come), times ``inflation``."""
    se_cap = row["se"] * math.sqrt(look / design.cap)
    df_cap = row["df"] + design.cap - look
    fixed = starts.mdc_pct(se_cap, df_cap, design.alpha / design.rows)
    if math.isinf(fixed):
        return fixed
    return starts.as_pct(inflation(design) * math.log1p(fixed / 100))


def _futile(z: np.ndarray, look: int, design: Design, levels: Mapping[int, float]):
    """Conditional power to cross at the cap under the current trend, below the threshold."""
    if not design.futility or look >= design.cap:
        return np.zeros(np.shape(z), bool)
    t = look / design.cap
    c_cap = sps.norm.isf(levels[design.cap] / 2)
    power = sps.norm.sf((c_cap - np.abs(z) / math.sqrt(t)) / math.sqrt(1 - t))
    return power < design.futility_power


def _z(row: Mapping) -> float:
    """The row's t statistic as a normal score of the same two-sided p-value."""
    p = row["p"]
    return float(sps.norm.isf(p / 2)) if p > 0 else math.inf


def decide_row(row: dict, look: int, design: Design) -> tuple[str, dict]:
    """One row (``starts.compare``'s, tested) at ``look`` starts: (status, judged row)."""
    levels = design.levels()
    # the detectable change is stated once, for the look the row ends at (decide_metric)
    judged = starts.judge(row, levels[look], design.margin_pct, design.alpha, with_mdc=False)
    if judged["verdict"] in (starts.BETTER, starts.WORSE):
        return CHANGED, judged
    if judged["verdict"] == starts.EQUIVALENT:
        return EQUIVALENT, judged
    if bool(_futile(np.asarray(_z(row)), look, design, levels)):
        return FUTILE, judged
    return (CAP if look >= design.cap else CONTINUE), judged


def decide_metric(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], higher: bool, design: Design
) -> dict:
    """One row's state after the starts so far (paired groups), replaying every look from
    the minimum: ``status``, ``starts`` (the look it settled at, or the starts so far) and
    ``row`` (judged at that look; None before the minimum)."""
    n = len(a)
    state = {"status": CONTINUE, "starts": n, "row": None}
    for look in range(design.min_starts, min(n, design.cap) + 1):
        row = starts.compare(a[:look], b[:look], higher_is_better=higher, paired=True)
        status, judged = decide_row(row, look, design)
        state = {"status": status, "starts": look if status != CONTINUE else n, "row": judged}
        if status != CONTINUE:
            break
    if state["row"] is not None:
        state["row"]["mdc_pct"] = design_mdc_pct(state["row"], min(state["starts"], design.cap),
                                                 design)  # fmt: skip
    return state


def decide(
    groups: Mapping[str, tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]],
    higher_is_better: Mapping[str, bool],
    design: Design,
    *,
    invalid: int = 0,
) -> dict:
    """Whether a point needs another round. ``groups``: per metric, (A's, B's) valid
    repeats per start so far, paired (start k's repeat j of A with that of B). A pure
    function of the data: the report replays it on the same starts. Returns ``action``
    ("continue" / "stop"), ``reason`` ("settled", "cap reached", "too many invalid repeats"
    or "continue"), ``starts`` and per metric ``decide_metric``'s answer."""
    counts = {len(a) for a, _ in groups.values()} | {len(b) for _, b in groups.values()}
    if len(counts) > 1:
        raise ValueError(f"every metric needs the same starts, got counts {sorted(counts)}")
    n = counts.pop() if counts else 0
    metrics = {m: decide_metric(a, b, higher_is_better[m], design) for m, (a, b) in groups.items()}
    out = {"starts": n, "invalid": invalid, "metrics": metrics}
    statuses = {s["status"] for s in metrics.values()}
    if invalid > design.max_invalid:
        reason = INVALID
    elif n >= design.cap or (n >= design.min_starts and CONTINUE not in statuses):
        reason = SETTLED if statuses <= set(SETTLED_STATUSES) else CAP
    else:
        reason = CONTINUE
    out["action"] = CONTINUE if reason == CONTINUE else "stop"
    out["reason"] = reason
    return out


def simulate(
    a: np.ndarray,
    b: np.ndarray,
    higher: np.ndarray,
    design: Design,
    points: int,
    *,
    prior_var: np.ndarray | float | None = None,
    prior_df: int = 0,
) -> dict:
    """``decide`` on arrays: a, b of shape (tables, points * metrics, cap, repeats) hold
    every start a point could take; the rows of a point are contiguous. Returns ``codes``
    (tables, rows: +1 better, -1 worse, 0 inconclusive, 2 equivalent), ``status`` (index
    into (CHANGED, EQUIVALENT, FUTILE, CAP)), ``settled_at`` (tables, rows) and ``starts``
    (tables, points): the starts each point used (its last row's look)."""
    tables, rows, cap, _ = a.shape
    if cap != design.cap or rows % points:
        raise ValueError(f"arrays of {cap} starts and {rows} rows do not fit the design")
    levels = design.levels()
    higher = np.broadcast_to(np.asarray(higher, bool), (tables, rows))
    codes = np.zeros((tables, rows), np.int8)
    status = np.full((tables, rows), 3, np.int8)
    settled_at = np.full((tables, rows), cap, np.int32)
    open_ = np.ones((tables, rows), bool)
    for look in design.looks:
        est, se, df = starts.paired_arrays(a[..., :look, :], b[..., :look, :], prior_var, prior_df)
        code = starts.judge_arrays(est, se, df, higher, levels[look], design.margin_pct)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(se > 0, 2 * sps.t.sf(np.abs(est) / np.where(se > 0, se, 1), df), 0.0)
        z = np.where(p > 0, sps.norm.isf(np.maximum(p, 1e-300) / 2), np.inf)
        futile = _futile(z, look, design, levels) & ~np.isin(code, (1, -1, 2))
        final = look == cap
        for idx, hit in ((0, np.isin(code, (1, -1))), (1, code == 2), (2, futile)):
            new = hit & open_
            status[new], codes[new], settled_at[new] = idx, code[new], look
            open_ &= ~new
        if final:
            codes[open_] = code[open_]
    used = settled_at.reshape(tables, points, rows // points).max(axis=-1)
    return {"codes": codes, "status": status, "settled_at": settled_at, "starts": used}
