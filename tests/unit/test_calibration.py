"""The serving verdicts' error rates on noise fitted to the committed real runs: the report's
fixed-count rule and the group-sequential rule must keep the false-change rate of A/A tables
at or below 5% and reach 80% power at a planted change at least the detectable change they
state. The checks must be able to fail: a rule that always says "inconclusive" and one that
always says "changed" fail them here, and so do the rules with their spending removed or
their measured variance replaced by a constant (the commit that added these tests shows
each mutation failing).

Fixed seeds, 2,000 simulated tables per figure, numpy throughout: seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cellbench.report import comparison_tables
from cellbench.stats import calibration, comparison, noise, sequential, starts

ROOT = Path(__file__).resolve().parents[2]
METRIC = "mean_tpot_ms"
POINTS = 4
ROWS = POINTS * len(noise.METRICS)
# One repeat per start, as the embedded default and the rehearsal run.
REPEATS = 1
# An earlier run's start-to-start variance: the archive of the same cell, 30 degrees of
# freedom (e.g. ten runs of three starts).
HISTORY_DF = 30


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    return noise.committed_runs(ROOT)


@pytest.fixture(scope="module")
def model(runs) -> noise.NoiseModel:
    return noise.fit(runs, "h200-all")


# --- the noise models ---


def test_the_committed_runs_are_read_whole(runs):
    # 3 runs x 2 arms x (2 grid points x 2 concurrencies) x 3 repeats, each a real measurement
    assert len(runs) == 72 and runs.run.nunique() == 3
    assert (runs[list(noise.METRICS)] > 0).all().all() and (runs.failed == 0).all()


def test_the_fit_recovers_the_spreads_it_is_drawn_with(model):
    """Draw from a model, fit the draws as if they were runs, and get the model back: the fit
    and the draw agree on what own, shared and start mean."""
    rng = np.random.default_rng(3)
    runs_, points, pairs = 400, 4, 3
    a, b = noise.draw(model, rng, tables=runs_, points=points, pairs=pairs)
    frames = []
    r, p, k = (x.ravel() for x in np.indices((runs_, points, pairs)))
    for arm, side, first in (("untuned", a, 0), ("tuned", b, 1)):
        values = side.transpose(0, 1, 3, 2).reshape(-1, len(noise.METRICS))
        frame = pd.DataFrame(values, columns=list(noise.METRICS))
        # pair k holds slots 2k and 2k+1, A first on even k (noise.draw's order)
        seq = 2 * k + np.where(k % 2 == 0, first, 1 - first)
        frames.append(frame.assign(run=r, arm=arm, isl=p, osl=1, max_concurrency=1, repeat=k,
                                   seq=seq))  # fmt: skip
    refit = noise.fit(pd.concat(frames, ignore_index=True), "refit")
    np.testing.assert_allclose(refit.own, model.own, rtol=0.05)
    np.testing.assert_allclose(refit.shared, model.shared, rtol=0.1)
    np.testing.assert_allclose(refit.start, model.start, rtol=0.2)


def test_starts_are_drawn_with_their_own_offsets(model):
    rng = np.random.default_rng(4)
    a, b = noise.draw_starts(model, rng, tables=3000, points=1, starts=2, repeats=1)
    assert a.shape == (3000, 1, 4, 2, 1)
    d = (np.log(b) - np.log(a))[:, 0, 1, :, 0]  # TPOT's log-ratio per start
    expected = calibration.start_mean_variance(model, METRIC, 1)
    assert d.var() == pytest.approx(expected, rel=0.1)


# --- the rules ---


def _history(model: noise.NoiseModel) -> dict:
    return {"prior_var": calibration.row_variances(model, REPEATS, POINTS), "prior_df": HISTORY_DF}


def _fixed_mdc(model, starts_: int, prior_df: int = 0) -> float:
    return calibration.expected_mdc(model, METRIC, starts_=starts_, repeats=REPEATS, rows=ROWS,
                                    prior_df=prior_df)  # fmt: skip


def _sequential_mdc(model, cap: int, prior_df: int = 0) -> float:
    design = sequential.Design(rows=ROWS, cap=cap)
    fixed = _fixed_mdc(model, cap, prior_df)
    return 100 * math.expm1(sequential.inflation(design) * math.log1p(fixed / 100))


# planted changes: 5% above the stated detectable change (at least it, as promised)
PLANT = 1.05


@pytest.mark.parametrize("starts_, history", [(8, False), (3, True)])
def test_the_fixed_rule_holds_its_rates(model, starts_, history):
    kw = _history(model) if history else {}
    mdc = _fixed_mdc(model, starts_, HISTORY_DF if history else 0)
    failures = calibration.check(calibration.report_verdicts(**kw), model, starts_=starts_,
                                 repeats=REPEATS, effect_pct=PLANT * mdc)  # fmt: skip
    assert failures == []


@pytest.mark.parametrize("history", [False, True])
def test_the_sequential_rule_holds_its_rates(model, history):
    kw = _history(model) if history else {}
    cap = 8
    mdc = _sequential_mdc(model, cap, HISTORY_DF if history else 0)
    verdict = calibration.sequential_verdicts(POINTS, **kw)
    failures = calibration.check(verdict, model, starts_=cap, repeats=REPEATS,
                                 effect_pct=PLANT * mdc)  # fmt: skip
    assert failures == []


def test_sequential_spending_is_what_holds_the_rate(model):
    """The same rule testing every look at the full row level (spending removed) calls far
    more A/A tables changed: the spending is load-bearing, not decoration."""
    cap = 8
    loose = calibration.sequential_verdicts(POINTS, design_kw={"spending": False})
    r = calibration.false_change_rate(model, loose, starts_=cap, repeats=REPEATS, tables=2000)
    assert r["rate"] > 0.1


def test_always_inconclusive_and_always_changed_fail(model):
    def never(a, b, higher):
        return np.zeros(a.shape[:-2], np.int8)

    def always(a, b, higher):
        up = (np.log(b) - np.log(a)).mean(axis=(-1, -2)) > 0
        return np.where(up == higher, 1, -1).astype(np.int8)

    mdc = PLANT * _fixed_mdc(model, 8)
    never_fails = calibration.check(never, model, starts_=8, effect_pct=mdc)
    assert len(never_fails) == 1 and never_fails[0].startswith("power")
    always_fails = calibration.check(always, model, starts_=8, effect_pct=mdc)
    assert len(always_fails) == 1 and always_fails[0].startswith("false-change rate")


def test_a_constant_variance_fails(model):
    """The variance replaced by a constant (the old fixed restart term's way): too small a
    constant calls A/A tables changed, too large a one misses the stated change."""
    var = calibration.row_variances(model, REPEATS, POINTS)
    mdc = PLANT * _fixed_mdc(model, 8)
    small = calibration.report_verdicts(prior_var=var / 16, prior_df=10_000)
    large = calibration.report_verdicts(prior_var=var * 4, prior_df=10_000)
    assert any(f.startswith("false-change") for f in
               calibration.check(small, model, starts_=8, effect_pct=mdc))  # fmt: skip
    assert any(f.startswith("power") for f in
               calibration.check(large, model, starts_=8, effect_pct=mdc))  # fmt: skip


# --- a failed or invalid repeat is counted next to the verdict, never dropped ---


def _side(values: list[float], extra: dict | None = None, side: int = 0) -> pd.DataFrame:
    rows = []
    for k, v in enumerate(values):
        row = {"isl": 8, "osl": 4, "max_concurrency": 1, "start": k // 2, "repeat": k,
               "seq": 2 * k + side, "num_prompts": 10, "failed": 0, "mean_tpot_ms": v,
               "mean_ttft_ms": v, "mean_e2el_ms": v, "output_throughput": 1000 / v}  # fmt: skip
        row.update((extra or {}).get(k, {}))
        rows.append(row)
    return pd.DataFrame(rows)


def test_invalid_repeats_are_counted_and_named():
    a = _side([20.0, 20.2, 19.8, 20.1, 20.3, 19.9], {2: {"invalid": "server restarted"}})
    b = _side([22.0, 22.2, 21.8, 22.1, 22.3, 21.9], {0: {"failed": 2}}, side=1)
    rows = comparison.compare_serve(a, b, min_change_pct=2.0)
    tpot = next(r for r in rows if r["metric"] == "mean_tpot_ms")
    assert (tpot["invalid_a"], tpot["invalid_b"]) == (1, 1)
    assert tpot["invalid_reasons"] == ["2 of 10 requests failed", "server restarted"]
    # repeats 1, 3, 4 and 5 remain paired; repeat 0 of A and repeat 2 of B lost partners
    assert tpot["test"] == starts.PAIRED and (tpot["repeats_a"], tpot["repeats_b"]) == (4, 4)
    assert tpot["unpaired"] == 2 and tpot["starts_a"] == 3
    lines = comparison_tables.render_serve(a, b, min_change_pct=2.0)
    row = next(line for line in lines if "mean_tpot_ms" in line)
    assert "1/1 (+2 unpaired)" in row
    assert any(line.startswith("Invalid repeats, left out") and "server restarted" in line
               for line in lines)  # fmt: skip


def test_a_point_with_no_valid_repeat_keeps_its_row():
    a = _side([20.0, 20.2, 19.8])
    b = _side([22.0, 22.2, 21.8], {k: {"failed": 10} for k in range(3)}, side=1)
    rows = comparison.compare_serve(a, b)
    assert {r["metric"] for r in rows} == set(comparison.METRICS)
    assert all(r["invalid_b"] == 3 and r["verdict"].startswith("n/a") for r in rows)
