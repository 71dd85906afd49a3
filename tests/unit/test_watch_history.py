"""Change points of the history (Apache Otava through cellbench.watch.history) on series with a
known shift: planted data, the detector is Otava's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from cellbench.watch import history


def rows(values_by_series: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    out = []
    for (arm, metric), values in values_by_series.items():
        for i, v in enumerate(values):
            out.append({"label": "rocm7.2", "run": f"run{i:02d}", "time": f"2026-11-{i + 1:02d}",
                        "cell": "rocm7.2/m/tp1-ep1", "image": "rocm7.2", "arm": arm,
                        "point": "64-16 c2", "metric": metric, "value": v, "repeats": 3,
                        "digest": f"sha256:{i}", "vllm_version": f"0.{i}.0"})  # fmt: skip
    return pd.DataFrame(out)


def test_a_planted_shift_is_found_at_its_run_with_its_size_and_flat_series_have_none():
    rng = np.random.default_rng(7)
    shifted = list(30 + rng.normal(0, 0.2, 6)) + list(36 + rng.normal(0, 0.2, 5))
    flat = list(50 + rng.normal(0, 0.2, 11))
    found = history.change_points(
        rows({("untuned", "mean_tpot_ms"): shifted, ("untuned", "mean_ttft_ms"): flat}),
        max_pvalue=0.01, min_magnitude_pct=5,
    )  # fmt: skip
    assert len(found) == 1
    cp = found.iloc[0]
    assert (cp.metric, cp.run, cp.run_before) == ("mean_tpot_ms", "run06", "run05")
    assert cp.pvalue < 0.01
    assert cp.shift_pct == pytest.approx(20, abs=2)
    assert cp.mean_before == pytest.approx(30, abs=0.3)


def test_a_shift_below_the_floor_is_not_a_change_point():
    rng = np.random.default_rng(3)
    small = list(30 + rng.normal(0, 0.05, 6)) + list(30.6 + rng.normal(0, 0.05, 5))
    series = rows({("tuned", "mean_tpot_ms"): small})
    assert len(history.change_points(series, max_pvalue=0.01, min_magnitude_pct=0)) == 1
    assert history.change_points(series, max_pvalue=0.01, min_magnitude_pct=5).empty


def test_series_shorter_than_three_runs_are_not_searched():
    assert history.change_points(rows({("tuned", "mean_tpot_ms"): [1.0, 9.0]})).empty
