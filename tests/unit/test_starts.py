"""Server starts as the unit of replication: variance components from the data, their pooling
with earlier runs, and verdicts whose change, interval, p and answer rest on one statistic.

Pure numbers: numpy and scipy only, no file but the bench.json files a prior is read from.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from cellbench.report import comparison_tables
from cellbench.stats import comparison, starts
from scipy import stats as sps

METRICS = list(comparison.METRICS)


def test_components_by_hand():
    # starts with means 1, 3, 5 (spread 4 = MSB / 2) and within-start deviations +-1
    groups = [[0.0, 2.0], [2.0, 4.0], [4.0, 6.0]]
    c = starts.components(groups)
    # MSW = 6 * 1 / 3 = 2; MSB = 2 * ((1-3)^2 + 0 + (5-3)^2) / 2 = 8; between = (8 - 2) / 2
    assert (c.within, c.between, c.df_within, c.df_between) == (2.0, 3.0, 3, 2)
    # a start mean's variance from the data alone: the start means' sample variance, 2 df
    assert starts.start_means_variance(groups) == (3.0, 4.0, 2)
    # MSB below MSW: no start part, never a negative variance
    flat = starts.components([[0.0, 4.0], [1.0, 3.0]])
    assert flat.between == 0.0 and flat.within == 5.0
    # one start: within only, nothing between
    one = starts.components([[1.0, 2.0, 3.0]])
    assert math.isnan(one.between) and one.df_between == 0 and one.within == 1.0


def test_components_recover_what_they_are_drawn_with():
    rng = np.random.default_rng(5)
    between, within = 0.03**2, 0.02**2
    found = []
    for _ in range(400):
        offsets = rng.normal(0, math.sqrt(between), size=(6, 1))
        found.append(starts.components(offsets + rng.normal(0, math.sqrt(within), size=(6, 4))))
    pooled = starts.pool(found)
    assert pooled.between == pytest.approx(between, rel=0.1)
    assert pooled.within == pytest.approx(within, rel=0.05)
    assert (pooled.df_between, pooled.df_within) == (400 * 5, 400 * 18)


def test_pooling_weights_by_degrees_of_freedom_and_prior_reaches_the_test():
    data = starts.Components(between=4.0, within=1.0, df_between=2, df_within=6)
    prior = starts.Components(between=1.0, within=3.0, df_between=6, df_within=18)
    pooled = starts.pool([data, prior, None])
    assert pooled.between == pytest.approx((2 * 4 + 6 * 1) / 8)
    assert pooled.within == pytest.approx((6 * 1 + 18 * 3) / 24)
    # the test pools the start-mean variance at this run's repeats: 1 + 3 / 2 with 6 df
    groups = [[0.0, 2.0], [2.0, 4.0], [4.0, 6.0]]
    centre, var, df = starts.start_means_variance(groups, prior)
    assert (centre, df) == (3.0, 2 + 6)
    assert var == pytest.approx((2 * 4.0 + 6 * (1 + 3 / 2)) / 8)


def test_paired_compare_is_the_t_test_of_the_start_means():
    rng = np.random.default_rng(2)
    a = 100 * np.exp(rng.normal(0, 0.05, size=(4, 3)))
    b = a * np.exp(0.04 + rng.normal(0, 0.03, size=(4, 3)))
    r = starts.compare(a.tolist(), b.tolist(), higher_is_better=False, paired=True)
    d = (np.log(b) - np.log(a)).mean(axis=1)
    t = sps.ttest_1samp(d, 0.0)
    assert r["p"] == pytest.approx(t.pvalue) and r["df"] == 3
    # the change is the ratio of the geometric means the row shows
    assert r["estimate"] == pytest.approx(math.log(r["geomean_b"] / r["geomean_a"]))
    assert r["geomean_a"] == pytest.approx(math.exp(np.log(a).mean(axis=1).mean()))
    assert r["test"] == starts.PAIRED and r["starts_a"] == 4 and r["repeats_b"] == 12
    assert set(r["components"]) == {"a", "b", "d"}


def test_unpaired_compare_is_welch_on_the_start_means():
    rng = np.random.default_rng(3)
    a = np.exp(rng.normal(0, 0.05, size=(5, 2)))
    b = np.exp(0.1 + rng.normal(0, 0.08, size=(3, 2)))
    r = starts.compare(a.tolist(), b.tolist(), higher_is_better=True, paired=False)
    ma, mb = np.log(a).mean(axis=1), np.log(b).mean(axis=1)
    welch = sps.ttest_ind(mb, ma, equal_var=False)
    assert r["p"] == pytest.approx(welch.pvalue) and r["test"] == starts.UNPAIRED


def test_one_start_a_side_and_no_history_is_not_a_verdict():
    r = starts.compare([[1.0, 1.1, 0.9]], [[2.0, 2.1, 1.9]], higher_is_better=False, paired=True)
    assert r["verdict"] == starts.ONE_START and not r["df"]
    [judged] = starts.verdicts([r])
    assert judged["verdict"] == starts.ONE_START and math.isinf(judged["mdc_pct"])
    # with an earlier run's start-to-start variance the same start can be tested
    prior = {"d": starts.Components(0.01**2, 0.01**2, 10, 30)}
    r = starts.compare([[1.0, 1.1, 0.9]], [[2.0, 2.1, 1.9]], higher_is_better=False,
                       paired=True, prior=prior)  # fmt: skip
    assert r["df"] == 10 and starts.verdicts([r])[0]["verdict"] == starts.WORSE


def test_four_answers_and_what_each_needs():
    def row(est: float, se: float, higher: bool = False) -> dict:
        return {"estimate": est, "se": se, "df": 20, "higher_is_better": higher,
                "p": float(2 * sps.t.sf(abs(est) / se, 20))}  # fmt: skip

    level = 0.05
    assert starts.judge(row(0.10, 0.01), level, 2.0)["verdict"] == starts.WORSE
    assert starts.judge(row(0.10, 0.01, True), level, 2.0)["verdict"] == starts.BETTER
    eq = starts.judge(row(0.001, 0.002), level, 2.0)
    assert eq["verdict"] == starts.EQUIVALENT and -2 < eq["ci_low"] < eq["ci_high"] < 2
    # significant yet inside the margin: smaller than worth calling
    assert starts.judge(row(0.006, 0.001), level, 2.0)["verdict"] == starts.EQUIVALENT
    inc = starts.judge(row(0.01, 0.05), level, 2.0)
    assert inc["verdict"] == starts.INCONCLUSIVE
    # what it could have seen: 80% power at this level and spread, by the noncentral t
    delta = math.log1p(inc["mdc_pct"] / 100) / 0.05
    q = sps.t.isf(level / 2, 20)
    assert sps.nct.sf(q, 20, delta) + sps.nct.cdf(-q, 20, delta) == pytest.approx(0.8, abs=1e-4)
    assert "could have seen changes of at least" in comparison_tables.verdict_text(inc)
    # two starts and a table's level: next to nothing can be seen, and the row says so plainly
    blind = starts.judge({**row(0.01, 0.05), "df": 1}, 0.05 / 16, 2.0)
    assert blind["mdc_pct"] > 1000 and comparison_tables.could_see(blind) == "over 1000%"


def _random_table(rng: np.random.Generator, starts_: int, repeats: int) -> tuple:
    points = [(32, 8), (64, 8)]
    rows_a, rows_b, seq = [], [], 0
    effect = {m: rng.choice([0.0, 0.05, -0.3, 0.6]) for m in METRICS}
    for k in range(starts_):
        offset = rng.normal(0, rng.choice([0.001, 0.05, 0.3]))
        for j in range(repeats):
            for isl, osl in points:
                base = {"isl": isl, "osl": osl, "max_concurrency": 2, "repeat": k * repeats + j,
                        "start": k, "num_prompts": 4, "failed": 0}  # fmt: skip
                noise_a = {m: rng.normal(0, 0.05) for m in METRICS}
                a = {m: 50 * math.exp(offset + noise_a[m]) for m in METRICS}
                b = {m: a[m] * math.exp(effect[m] + rng.normal(0, 0.05)) for m in METRICS}
                rows_a.append({**base, "seq": seq, **a})
                rows_b.append({**base, "seq": seq + 1, **b})
                seq += 2
    return pd.DataFrame(rows_a), pd.DataFrame(rows_b)


@pytest.mark.parametrize("paired", [True, False])
def test_a_verdict_never_disagrees_with_its_interval_p_or_values(paired):
    """Property over random tables: better/worse exactly when p adj < alpha and the interval
    excludes no change and is not inside the margin; equivalent exactly when the interval
    lies inside it; the change's sign is the sign of geomean B - geomean A, and the change
    lies inside its interval."""
    rng = np.random.default_rng(17)
    seen = set()
    for _ in range(40):
        a, b = _random_table(rng, int(rng.integers(2, 6)), int(rng.integers(1, 4)))
        margin = float(rng.choice([1.0, 2.0, 5.0]))
        for r in comparison.compare_serve(a, b, min_change_pct=margin, paired=paired):
            seen.add(r["verdict"])
            lo, hi, change = r["ci_low"], r["ci_high"], r["change_pct"]
            assert lo <= change <= hi
            assert np.sign(change) == np.sign(r["geomean_b"] - r["geomean_a"])
            inside = -margin < lo and hi < margin
            excludes = lo > 0 or hi < 0
            assert (r["p_adj"] < starts.ALPHA) == excludes, r
            if r["verdict"] == starts.EQUIVALENT:
                assert inside
            elif r["verdict"] in (starts.BETTER, starts.WORSE):
                assert excludes and not inside
                worse = (change > 0) != r["higher_is_better"]
                assert (r["verdict"] == starts.WORSE) == worse
            else:
                assert r["verdict"] == starts.INCONCLUSIVE and not excludes and not inside
                assert r["mdc_pct"] > 0
    # every answer occurs (equivalence needs the pairing: unpaired, start offsets stay in)
    assert seen == set(starts.ANSWERS) - (set() if paired else {starts.EQUIVALENT})


def test_the_array_rule_is_the_reports_rule():
    rng = np.random.default_rng(11)
    tables, points, k, n = 40, 2, 3, 2
    a = 100 * np.exp(rng.normal(0, 0.05, size=(tables, points * 4, k, n)))
    jump = rng.choice([0.0, 0.3, -0.01], (tables, points * 4, 1, 1))
    b = a * np.exp(rng.normal(0, 0.04, size=a.shape) + jump)
    higher = np.tile(list(comparison.METRICS.values()), points)
    fast = starts.fixed_verdicts(a, b, higher, margin_pct=2.0)
    code = {v: c for c, v in starts.CODES.items()}
    for t in range(tables):
        frames = []
        for side, values in (("a", a[t]), ("b", b[t])):
            rows = []
            for p in range(points):
                for s in range(k):
                    for j in range(n):
                        rows.append({"isl": 8 * (p + 1), "osl": 4, "max_concurrency": 1,
                                     "start": s, "repeat": s * n + j, "num_prompts": 4,
                                     "failed": 0, "seq": 2 * (s * n + j) + (side == "b"),
                                     **{m: values[p * 4 + i, s, j]
                                        for i, m in enumerate(METRICS)}})  # fmt: skip
            frames.append(pd.DataFrame(rows))
        slow = comparison.compare_serve(*frames, min_change_pct=2.0)
        assert fast[t].tolist() == [code[r["verdict"]] for r in slow], t
    assert set(np.unique(fast)) >= {0, 1, -1}


def test_sides_of_two_runs_are_compared_unpaired():
    rng = np.random.default_rng(4)
    a, b = _random_table(rng, 3, 2)
    # the same seq numbers on both sides: two runs, never interleaved
    b = b.assign(seq=a["seq"].to_numpy())
    assert not comparison.interleaved(a, b)
    rows = comparison.compare_serve(a, b)
    assert {r["test"] for r in rows} == {starts.UNPAIRED}


def _bench(path, starts_, values):
    points = [
        {
            "isl": 8,
            "osl": 4,
            "max_concurrency": 1,
            "start": s,
            "repeat": s * 2 + j,
            "mean_tpot_ms": v,
        }  # fmt: skip
        for s, row in enumerate(values)
        for j, v in enumerate(row)
    ]
    path.write_text(json.dumps({"points": points}))
    return path


def test_prior_from_benches_pools_earlier_runs(tmp_path):
    a1 = _bench(tmp_path / "a1.json", 2, [[10.0, 10.2], [11.0, 10.8]])
    b1 = _bench(tmp_path / "b1.json", 2, [[12.0, 12.1], [12.5, 12.7]])
    a2 = _bench(tmp_path / "a2.json", 2, [[9.0, 9.4], [9.9, 9.7]])
    b2 = _bench(tmp_path / "b2.json", 2, [[9.5, 9.6], [10.0, 10.4]])
    prior = starts.prior_from_benches([(a1, b1), (a2, b2)], ["mean_tpot_ms"])
    key = ((8, 4, 1), "mean_tpot_ms")
    log = np.log
    d1 = [[log(12.0 / 10.0), log(12.1 / 10.2)], [log(12.5 / 11.0), log(12.7 / 10.8)]]
    d2 = [[log(9.5 / 9.0), log(9.6 / 9.4)], [log(10.0 / 9.9), log(10.4 / 9.7)]]
    expected = starts.pool([starts.components(d1), starts.components(d2)])
    assert prior[key]["d"] == expected and prior[key]["d"].df_between == 2
    assert prior[key]["a"].df_within == 4
