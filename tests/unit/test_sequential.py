"""Server starts that stop once the answer is known (cellbench.stats.sequential): the
Lan-DeMets boundaries against published values and scipy's multivariate normal integral,
the function the serve stage calls (``decide``) against its array twin (``simulate``), and
the rule's answers on hand-made starts. Fixed seeds; seconds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cellbench.report import comparison_tables
from cellbench.stats import calibration, comparison, noise, sequential, starts
from scipy import stats as sps

ROOT = Path(__file__).resolve().parents[2]
HIGHER = dict(noise.METRICS)
METRICS = list(noise.METRICS)


@pytest.fixture(scope="module")
def model() -> noise.NoiseModel:
    return noise.fit(noise.committed_runs(ROOT), "h200-all")


def test_boundaries_are_the_published_obrien_fleming_ones():
    # Lan-DeMets O'Brien-Fleming type, five equally spaced looks, two-sided alpha 0.05:
    # 4.877, 3.357, 2.680, 2.290, 2.031 (the tables of DeMets and Lan, and R's ldbounds)
    levels = sequential.nominal_levels((0.2, 0.4, 0.6, 0.8, 1.0), 0.05)
    bounds = [float(sps.norm.isf(p / 2)) for p in levels]
    assert bounds == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=2e-3)
    # the spent alpha: all of it by the cap, little early
    assert sequential.obf_spent(1.0, 0.05) == pytest.approx(0.05)
    assert sequential.obf_spent(0.2, 0.05) < 1e-5


def test_boundaries_hold_alpha_on_the_correlated_looks():
    """scipy's multivariate normal integral of the same looks: the chance of crossing any
    boundary under no change is the alpha spent, not a union bound's sum of levels."""
    fractions = (2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0)
    alpha = 0.05 / 16
    levels = sequential.nominal_levels(fractions, alpha)
    t = np.asarray(fractions)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    c = sps.norm.isf(np.asarray(levels) / 2)
    crossed = 1 - sequential.inside_probability(cov, c)
    assert crossed == pytest.approx(alpha, rel=0.02)
    assert sum(levels) > alpha * 1.1  # a union bound would have charged more


def test_design_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="min_starts"):
        sequential.Design(rows=4, cap=1)
    with pytest.raises(ValueError, match="min_starts"):
        sequential.Design(rows=4, cap=3, min_starts=4)
    with pytest.raises(ValueError, match="margin_pct"):
        sequential.Design(rows=4, cap=3, margin_pct=0.0)
    design = sequential.Design(rows=16, cap=6, min_starts=2)
    assert design.looks == (2, 3, 4, 5, 6)
    levels = design.levels()
    assert list(levels.values()) == sorted(levels.values()) and levels[6] < 0.05 / 16


def _groups(a: np.ndarray, b: np.ndarray, n: int) -> dict:
    """(starts, repeats) arrays per metric -> decide's groups for the first n starts."""
    return {m: (a[j, :n].tolist(), b[j, :n].tolist()) for j, m in enumerate(METRICS)}


def test_decide_equals_simulate(model):
    """The serve stage's call, round by round, against the array version on the same draws."""
    points, cap, tables, repeats = 2, 6, 30, 2
    design = sequential.Design(rows=points * len(METRICS), cap=cap)
    effect = np.zeros((tables, points, len(METRICS)))
    effect[::2, 0, :] = [80.0, 80.0, 80.0, -45.0]  # every other table: point 0 much worse
    a, b = noise.draw_starts(model, np.random.default_rng(8), tables=tables, points=points,
                             starts=cap, repeats=repeats, effect_pct=effect)  # fmt: skip
    higher = np.tile(calibration.HIGHER, points)
    sim = sequential.simulate(calibration._flat(a), calibration._flat(b), higher, design, points)
    code = {v: c for c, v in starts.CODES.items()}
    for t in range(tables):
        for p in range(points):
            for n in range(design.min_starts, cap + 1):
                step = sequential.decide(_groups(a[t, p], b[t, p], n), HIGHER, design)
                if step["action"] == "stop":
                    break
            assert step["starts"] == sim["starts"][t, p], (t, p)
            for j, m in enumerate(METRICS):
                row = step["metrics"][m]
                assert row["starts"] == sim["settled_at"][t, p * 4 + j], (t, p, m)
                assert code[row["row"]["verdict"]] == sim["codes"][t, p * 4 + j], (t, p, m)
    assert (sim["starts"] < cap).any() and (sim["codes"] == -1).any()


def test_a_large_change_stops_early_and_the_row_says_so():
    rng = np.random.default_rng(1)
    a = 100 * np.exp(rng.normal(0, 0.01, size=(4, 6, 2)))
    b = a * np.exp(rng.normal(0, 0.01, size=a.shape))
    b[1] *= 1.5  # TPOT 50% worse
    design = sequential.Design(rows=4, cap=6, min_starts=2)
    step = sequential.decide(_groups(a, b, 3), HIGHER, design)
    tpot = step["metrics"]["mean_tpot_ms"]
    assert tpot["status"] == sequential.CHANGED and tpot["row"]["verdict"] == starts.WORSE
    assert tpot["starts"] <= 3
    # the interval is the repeated confidence interval at the look's level
    assert tpot["row"]["level"] == design.levels()[tpot["starts"]]
    assert tpot["row"]["ci_low"] > 0 and tpot["row"]["p_adj"] < starts.ALPHA


def test_a_no_change_point_ends_equivalent_or_futile_never_changed():
    rng = np.random.default_rng(2)
    a = 100 * np.exp(rng.normal(0, 0.002, size=(4, 6, 2)))
    b = a * np.exp(rng.normal(0, 0.002, size=a.shape))
    design = sequential.Design(rows=4, cap=6, min_starts=2)
    step = sequential.decide(_groups(a, b, 6), HIGHER, design)
    assert step["action"] == "stop" and step["reason"] == sequential.SETTLED
    for m in METRICS:
        assert step["metrics"][m]["status"] in (sequential.EQUIVALENT, sequential.FUTILE)
        assert step["metrics"][m]["row"]["verdict"] in (starts.EQUIVALENT, starts.INCONCLUSIVE)
    # below the minimum it never stops
    early = sequential.decide(_groups(a, b, 1), HIGHER, design)
    assert early["action"] == "continue"
    # too many invalid repeats: stop with what it has
    invalid = sequential.decide(_groups(a, b, 2), HIGHER, design, invalid=3)
    assert invalid["reason"] == sequential.INVALID


def test_the_design_states_what_it_could_see():
    design = sequential.Design(rows=16, cap=8, min_starts=2)
    # spending and futility cost a little: more than the fixed test needs, not much more
    assert 1.0 < sequential.inflation(design) < 1.3
    row = {"se": 0.05, "df": 2}
    at_two = sequential.design_mdc_pct(row, 2, design)
    fixed = starts.mdc_pct(0.05 * math.sqrt(2 / 8), 2 + 6, 0.05 / 16)
    assert at_two == pytest.approx(
        100 * math.expm1(sequential.inflation(design) * math.log1p(fixed / 100))
    )


def test_the_report_replays_the_stages_rule():
    """compare_serve on points that record starts_cap takes the row the rule judged at the
    look where it settled, with the stop fields beside it."""
    rng = np.random.default_rng(6)
    rows_a, rows_b, seq = [], [], 0
    for s in range(3):
        for j in range(2):
            for isl, factor in ((8, 1.6), (16, 1.0)):
                base = {"isl": isl, "osl": 4, "max_concurrency": 1, "start": s,
                        "repeat": s * 2 + j, "num_prompts": 4, "failed": 0, "starts_min": 2,
                        "starts_cap": 3, "starts_used": 3, "stop_reason": "settled"}  # fmt: skip
                va = {m: 100 * math.exp(rng.normal(0, 0.01)) for m in METRICS}
                vb = {m: va[m] * (factor if m == "mean_tpot_ms" else 1.0) for m in METRICS}
                rows_a.append({**base, "seq": seq, **va})
                rows_b.append({**base, "seq": seq + 1, **vb})
                seq += 2
    rows = comparison.compare_serve(pd.DataFrame(rows_a), pd.DataFrame(rows_b))
    tpot = next(r for r in rows if r["metric"] == "mean_tpot_ms" and r["isl"] == 8)
    assert tpot["verdict"] == starts.WORSE and tpot["stop_status"] == sequential.CHANGED
    assert tpot["stop_starts"] == 2 and tpot["starts_a"] == 2  # judged on the look's starts
    assert tpot["starts_used"] == 3 and tpot["stop_reason"] == "settled"
    line = comparison_tables.stopped_text(tpot)
    assert line == "changed at 2; 3 of 3 starts: settled"
