"""Variance components and the detectable change of a design of starts and repeats
(cellbench.stats.plan_noise): a table worked by hand, the estimator against data drawn with
known components, and the detectable change against the power a simulated t-test reaches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cellbench.stats import plan_noise as pn
from scipy import stats as sps


def test_components_of_a_table_worked_by_hand():
    # log values [0, .2], [1, 1.2], [2, 2.2]: MS within = 0.06 / 3, MS between = 4 / 2,
    # n0 = 2, so var_start = (2 - 0.02) / 2.
    table = [[math.exp(a), math.exp(a + 0.2)] for a in (0.0, 1.0, 2.0)]
    c = pn.start_repeat_components(table)
    assert c.var_repeat == pytest.approx(0.02)
    assert c.var_start == pytest.approx(0.99)
    assert (c.df_start, c.df_repeat) == (2, 3)


def test_components_recover_what_the_data_were_drawn_with():
    rng = np.random.default_rng(7)
    sd_start, sd_repeat = 0.05, 0.10
    sizes = rng.integers(2, 7, size=400)  # unbalanced starts
    table = []
    for n in sizes:
        level = rng.normal(0, sd_start)
        table.append(list(np.exp(5.0 + level + rng.normal(0, sd_repeat, size=n))))
    c = pn.start_repeat_components(table)
    assert c.var_repeat == pytest.approx(sd_repeat**2, rel=0.1)
    assert c.var_start == pytest.approx(sd_start**2, rel=0.25)


def test_what_the_data_cannot_show_is_none():
    one_start = pn.start_repeat_components([[1.0, 1.1, 0.9]])
    assert one_start.var_start is None and one_start.var_repeat is not None
    one_repeat_each = pn.start_repeat_components([[1.0], [1.2], [0.9]])
    assert one_repeat_each.var_repeat is None and one_repeat_each.df_repeat == 0
    assert one_repeat_each.var_start > 0  # all the spread counts as between starts
    with pytest.raises(ValueError, match="positive measurement"):
        pn.start_repeat_components([[1.0, 0.0]])
    pooled = pn.pooled([pn.start_repeat_components([[1.0, 1.1], [1.3, 1.2]]), one_start])
    assert pooled.df_repeat == 2 + 2 and pooled.df_start == 1


def _power(var_start, var_repeat, starts, repeats, change_pct, sims=4000, seed=3):
    """Share of simulated runs (two arms, start means compared by Student's t) that call a
    true change of ``change_pct``."""
    rng = np.random.default_rng(seed)
    shift = math.log1p(change_pct / 100)

    def arm(offset):
        level = rng.normal(0, math.sqrt(var_start), size=(sims, starts))
        noise = rng.normal(0, math.sqrt(var_repeat), size=(sims, starts, repeats)).mean(axis=2)
        return offset + level + noise

    p = sps.ttest_ind(arm(0.0), arm(shift), axis=1).pvalue
    return float((p < 0.05).mean())


@pytest.mark.parametrize(("starts", "repeats"), [(3, 2), (6, 4)])
def test_the_detectable_change_is_seen_with_80_percent_power(starts, repeats):
    var_s, var_r = pn.pct_to_var(4.5), pn.pct_to_var(11.5)
    change = pn.detectable_pct(var_s, var_r, starts, repeats)
    # the t approximation's power is close to 0.8 (a few points, noncentral t)
    assert 0.74 <= _power(var_s, var_r, starts, repeats, change) <= 0.86
    assert _power(var_s, var_r, starts, repeats, change / 3) < 0.3
    assert pn.detectable_pct(var_s, var_r, 1, repeats) == math.inf


def test_kalibera_jones_repeats_and_starts_needed():
    # c_start / c_repeat = 30, var_repeat / var_start = 4: r* = sqrt(120) = 10.95
    assert pn.repeats_per_start(0.0025, 0.01, 300.0, 10.0, 1, 20) == 11
    assert pn.repeats_per_start(0.0025, 0.01, 300.0, 10.0, 1, 5) == 5
    assert pn.repeats_per_start(0.0025, 0.01, 1.0, 1000.0, 2, 5) == 2
    assert pn.repeats_per_start(0.0, 0.01, 300.0, 10.0, 1, 5) == 5  # starts do not vary
    var_s, var_r = pn.pct_to_var(2.0), pn.pct_to_var(5.0)
    n = pn.starts_needed(var_s, var_r, 3, 5.0, 50)
    assert pn.detectable_pct(var_s, var_r, n, 3) <= 5.0 < pn.detectable_pct(var_s, var_r, n - 1, 3)
    assert pn.starts_needed(var_s, var_r, 3, 0.5, 10) is None


def test_the_paired_detectable_change_is_seen_with_80_percent_power():
    # Interleaved arms: per start pair a log-ratio offset, per repeat pair its own noise; the
    # verdict tests the start pairs' mean ratio against 1 (one-sample t on starts - 1 df).
    var_s, var_r = 2 * pn.pct_to_var(4.5), 2 * pn.pct_to_var(11.5)
    starts, repeats, sims = 5, 3, 4000
    change = pn.detectable_pct(var_s, var_r, starts, repeats, paired=True)
    rng = np.random.default_rng(11)
    level = rng.normal(0, math.sqrt(var_s), size=(sims, starts))
    noise = rng.normal(0, math.sqrt(var_r), size=(sims, starts, repeats)).mean(axis=2)
    means = math.log1p(change / 100) + level + noise
    power = float((sps.ttest_1samp(means, 0.0, axis=1).pvalue < 0.05).mean())
    assert 0.74 <= power <= 0.86
    # Pairing spends degrees of freedom: with the same variances it sees less than apart.
    assert change > pn.detectable_pct(var_s / 2, var_r / 2, starts, repeats)
