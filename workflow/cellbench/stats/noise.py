"""Noise models of serving measurements, fitted to real runs, and synthetic repeat tables
drawn from them.

A serving comparison measures two sides A and B at each grid point in interleaved pairs
(A B, then B A, ...). On the log scale one measurement of a metric is modelled as

    log y[point, pair, side] = level[point] + shared[point, pair] + start[point, side]
                               + drift * t[pair, side] + own[point, pair, side] + effect[side]

- ``shared``: what both sides of one pair have in common (the prompts of that repeat, the
  machine's state at that minute). It cancels in a paired difference, not in Welch's test.
- ``start``: the offset of one server start, fixed for all repeats of that side in one run.
  Within one start it looks exactly like a real change; only separate starts show it, which
  is why a serve job measures several (``cellbench.stats.starts``).
- ``drift``: a trend over the measurement order (log units per measurement slot).
- ``own``: what is left, independent per measurement.

``fit`` estimates each part per metric from runs that measured both sides with repeats
(variance components of the paired log-ratios: within a run, between runs), ``draw`` makes
synthetic tables from the fit, either normal with the fitted spreads and the metrics'
correlation, or by resampling the fitted residual vectors (all metrics of one measurement
together, so heavy tails and correlations are the real ones).
"""

from __future__ import annotations

import io
import json
import math
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

# The serving metrics a comparison table tests, and whether a higher value is better.
METRICS = {
    "mean_ttft_ms": False,
    "mean_tpot_ms": False,
    "mean_e2el_ms": False,
    "output_throughput": True,
}
POINT = ["isl", "osl", "max_concurrency"]

# The committed runs with repeats of both arms: the three H200 runs of the local runtime
# (transformers serve on one GPU, config/gpu-local.yaml, 3 interleaved repeats per point).
# (label, file or tarball under the repo, member prefix inside the tarball or None)
_CELL = "results/host-cuda/small-qwen3-moe/tp1-ep1/serve"
COMMITTED_RUNS = (
    ("h200-run2", "benchmarks/results/gpu_local_h200_2026-12-04", None),
    ("h200-wave19", "benchmarks/results/gpu_local_h200_2026-12-04_wave19/results.tar.gz", _CELL),
    ("h200-wave24", "benchmarks/results/gpu_local_h200_2026-12-04_wave24/results.tar.gz", _CELL),
)


def bench_rows(bench: Mapping, run: str) -> list[dict]:
    """One row per measured point of a serve ``bench.json`` (already parsed): the run label,
    arm, grid point, repeat, job-wide order ``seq``, failures and the compared metrics."""
    rows = []
    for p in bench["points"]:
        row = {
            "run": run,
            "arm": bench["arm"],
            **{k: p.get(k) for k in POINT},
            "repeat": p["repeat"],
            "seq": p["seq"],
            "started_at": p.get("started_at"),
            "num_prompts": p.get("num_prompts"),
            "failed": p.get("failed", 0),
            "ttft_request_cv": _ratio(p.get("std_ttft_ms"), p.get("mean_ttft_ms")),
            "tpot_request_cv": _ratio(p.get("std_tpot_ms"), p.get("mean_tpot_ms")),
        }
        row.update({m: p.get(m) for m in METRICS})
        rows.append(row)
    return rows


def _ratio(a: float | None, b: float | None) -> float:
    return float(a) / float(b) if a is not None and b else math.nan


def committed_runs(root: Path, runs: Iterable[tuple[str, str, str | None]] = COMMITTED_RUNS):
    """The committed runs as one frame (``bench_rows`` of both arms of each)."""
    rows = []
    for label, where, member in runs:
        path = root / where
        for arm in ("untuned", "tuned"):
            if member is None:
                text = (path / _CELL / arm / "bench.json").read_text()
            else:
                with tarfile.open(path) as tar:
                    text = tar.extractfile(f"{member}/{arm}/bench.json").read().decode()
            rows += bench_rows(json.loads(text), label)
    return pd.DataFrame(rows)


@dataclass
class NoiseModel:
    """Per metric (in ``metrics`` order), in log units (0.01 is about 1%):

    ``own``: spread of one measurement given its pair; ``shared``: spread of what both sides
    of a pair share; ``start``: spread of one server start's offset; ``drift``: trend per
    measurement slot. ``corr``: correlation of the metrics' paired residuals.
    ``residuals`` (n x metrics): standardised paired residuals (the difference of a pair
    around its run's mean, scaled to unit ``own``), ``shared_residuals`` likewise for the
    pair means; ``draw(kind="empirical")`` resamples rows of both."""

    name: str
    metrics: tuple[str, ...]
    own: np.ndarray
    shared: np.ndarray
    start: np.ndarray
    drift: np.ndarray
    corr: np.ndarray
    residuals: np.ndarray
    shared_residuals: np.ndarray
    source: str = ""
    dof: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The model as plain numbers, in % of the level (100 * log units)."""
        pct = {
            part: {m: round(100 * float(v), 3) for m, v in zip(self.metrics, arr, strict=True)}
            for part, arr in (
                ("own_pct", self.own),
                ("shared_pct", self.shared),
                ("start_pct", self.start),
                ("drift_pct_per_slot", self.drift),
            )
        }
        return {
            "name": self.name,
            "source": self.source,
            **pct,
            "degrees_of_freedom": self.dof,
            "corr": np.round(self.corr, 3).tolist(),
            "residual_kurtosis": {
                m: round(float(_kurtosis(self.residuals[:, j])), 2)
                for j, m in enumerate(self.metrics)
            },
        }


def _kurtosis(x: np.ndarray) -> float:
    x = x - x.mean()
    return float(np.mean(x**4) / np.mean(x**2) ** 2) if np.any(x) else math.nan


def pairs(frame: pd.DataFrame, a: str = "untuned", b: str = "tuned") -> pd.DataFrame:
    """The two arms of each (run, point, repeat) side by side: log values of each metric
    (``<metric>_a``/``_b``) and each arm's ``seq``."""
    keys = ["run", *POINT, "repeat"]
    cols = [*keys, "seq", *METRICS]
    left = frame[frame.arm == a][cols]
    right = frame[frame.arm == b][cols]
    both = left.merge(right, on=keys, suffixes=("_a", "_b"))
    for m in METRICS:
        both[f"{m}_a"] = np.log(both[f"{m}_a"].astype(float))
        both[f"{m}_b"] = np.log(both[f"{m}_b"].astype(float))
    return both


def fit(frame: pd.DataFrame, name: str, source: str = "") -> NoiseModel:
    """Estimate a ``NoiseModel`` from measured pairs (``pairs``' input: ``bench_rows`` of two
    arms, several runs, the same points and repeats in each).

    With d = log B - log A per pair: around its (run, point) mean d has variance 2 own^2
    (pooled, R P (K - 1) degrees of freedom); the (run, point) means of d around their mean
    over runs (which holds any real arm difference) have variance 2 start^2 + 2 own^2 / K;
    the pair means around their (run, point) mean have variance shared^2 + own^2 / 2. Drift:
    the slope of d against the two arms' distance in the measurement order (the A B / B A
    alternation makes it identifiable next to a fixed arm difference)."""
    both = pairs(frame)
    metrics = tuple(METRICS)
    group_rp = both.groupby(["run", *POINT]).ngroup().to_numpy()
    group_p = both.groupby(POINT).ngroup().to_numpy()
    n_rp = group_rp.max() + 1
    gap = (both.seq_b - both.seq_a).to_numpy(float)
    own, shared, start, drift = (np.zeros(len(metrics)) for _ in range(4))
    resid, shared_resid = [], []
    k = both.groupby(["run", *POINT]).size().to_numpy()
    runs_per_point = both.groupby(POINT)["run"].nunique().to_numpy()
    for j, m in enumerate(metrics):
        la, lb = both[f"{m}_a"].to_numpy(), both[f"{m}_b"].to_numpy()
        d = lb - la
        # drift: least squares of d on the order gap with one intercept per (run, point),
        # i.e. the slope of both centred within their (run, point)
        d_rp_mean = np.bincount(group_rp, d) / np.bincount(group_rp)
        gap_c = gap - (np.bincount(group_rp, gap) / np.bincount(group_rp))[group_rp]
        drift[j] = float(np.sum(gap_c * (d - d_rp_mean[group_rp])) / np.sum(gap_c**2))
        r = d - d_rp_mean[group_rp]
        dof_own = len(d) - n_rp
        var_d = float(np.sum(r**2) / dof_own)
        own[j] = math.sqrt(var_d / 2)
        # between runs: (run, point) means of d around their point's mean
        rp_point = np.zeros(n_rp, int)
        rp_point[group_rp] = group_p
        p_mean = np.bincount(rp_point, d_rp_mean) / np.bincount(rp_point)
        dev = d_rp_mean - p_mean[rp_point]
        dof_start = int(np.sum(runs_per_point - 1))
        var_between = float(np.sum(dev**2) / dof_start)
        start[j] = math.sqrt(max(0.0, (var_between - var_d / float(np.mean(k))) / 2))
        s = (la + lb) / 2
        s_rp_mean = np.bincount(group_rp, s) / np.bincount(group_rp)
        rs = s - s_rp_mean[group_rp]
        var_s = float(np.sum(rs**2) / dof_own)
        shared[j] = math.sqrt(max(0.0, var_s - own[j] ** 2 / 2))
        # Centring on K values shrinks residuals by sqrt((K-1)/K): undo it for resampling.
        inflate = np.sqrt(k / (k - 1))[group_rp]
        resid.append(r * inflate / (math.sqrt(2) * own[j]) if own[j] else r * 0)
        shared_resid.append(rs * inflate / shared[j] if shared[j] else rs * 0)
    residuals = np.column_stack(resid)
    return NoiseModel(
        name=name,
        metrics=metrics,
        own=own,
        shared=shared,
        start=start,
        drift=drift,
        corr=np.corrcoef(residuals, rowvar=False),
        residuals=residuals,
        shared_residuals=np.column_stack(shared_resid),
        source=source,
        dof={"own": int(dof_own), "start": dof_start, "pairs": len(d)},
    )


def restart_test(frame: pd.DataFrame) -> dict:
    """Per metric: is there a server-start part at all? The F ratio of the between-run
    variance of the (run, point) mean log-ratios to what the repeats alone would give it
    (var_d / K), with its degrees of freedom and one-sided p-value."""
    from scipy import stats as sps

    both = pairs(frame)
    group_rp = both.groupby(["run", *POINT]).ngroup().to_numpy()
    k = float(np.mean(both.groupby(["run", *POINT]).size()))
    out = {}
    for m in METRICS:
        d = (both[f"{m}_b"] - both[f"{m}_a"]).to_numpy()
        rp_mean = np.bincount(group_rp, d) / np.bincount(group_rp)
        within = d - rp_mean[group_rp]
        df_w = len(d) - len(rp_mean)
        var_d = float(np.sum(within**2) / df_w)
        rp = both.assign(mean=rp_mean[group_rp]).drop_duplicates(["run", *POINT])
        dev = rp["mean"] - rp.groupby(POINT)["mean"].transform("mean")
        df_b = int(np.sum(rp.groupby(POINT).size() - 1))
        var_b = float(np.sum(dev**2) / df_b)
        f = var_b / (var_d / k)
        out[m] = {"F": round(f, 2), "df": [df_b, df_w], "p": float(sps.f.sf(f, df_b, df_w))}
    return out


def by_group(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``own`` and ``start`` spread (in %) of each metric per value of ``keys`` (e.g.
    concurrency, or output length): how the noise depends on the load."""
    out = []
    for value, part in frame.groupby(list(keys)):
        model = fit(part, str(value))
        row = dict(zip(keys, value if isinstance(value, tuple) else (value,), strict=True))
        for j, m in enumerate(model.metrics):
            row[f"{m} own %"] = round(100 * model.own[j], 2)
            row[f"{m} start %"] = round(100 * model.start[j], 2)
        out.append(row)
    return pd.DataFrame(out)


def draw(
    model: NoiseModel,
    rng: np.random.Generator,
    *,
    tables: int,
    points: int,
    pairs: int,
    effect_pct: np.ndarray | float = 0.0,
    kind: str = "normal",
    starts: bool = True,
    level: float = 100.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic repeat tables: (a, b) arrays of shape (tables, points, metrics, pairs) of
    positive values around ``level``, as measured in ``pairs`` interleaved pairs (pair k's
    order is A B for even k, B A for odd k).

    ``effect_pct``: B's true change in % of A, broadcast against (tables, points, metrics)
    (0: an A/A table). ``kind``: "normal" (the fitted spreads, the metrics' fitted
    correlation) or "empirical" (resampled residual rows of the fit). ``starts``: whether
    each side's server-start offset is drawn (off: one server start shared by a whole
    comparison, as the repeats of one run see it)."""
    if kind not in ("normal", "empirical"):
        raise ValueError(f"kind must be 'normal' or 'empirical', got {kind!r}")
    n_m = len(model.metrics)
    shape = (tables, points, pairs)
    if kind == "normal":
        chol = np.linalg.cholesky(_nearest_pd(model.corr))
        own_a = rng.standard_normal((*shape, n_m)) @ chol.T
        own_b = rng.standard_normal((*shape, n_m)) @ chol.T
        shared = rng.standard_normal((*shape, n_m)) @ chol.T
        diff = (own_b - own_a) / math.sqrt(2)
        common = (own_a + own_b) / math.sqrt(2)
    else:
        pick = rng.integers(0, len(model.residuals), size=shape)
        diff = model.residuals[pick]
        sign = rng.choice((-1.0, 1.0), size=(*shape, 1))  # a residual is as likely either way
        diff = diff * sign
        common = rng.standard_normal((*shape, n_m))
        shared = model.shared_residuals[rng.integers(0, len(model.shared_residuals), size=shape)]
    # own parts of the two sides from their (standardised) difference and sum
    own_a = (common - diff) / math.sqrt(2) * model.own
    own_b = (common + diff) / math.sqrt(2) * model.own
    base = shared * model.shared
    # measurement slots: pair k holds slots 2k and 2k+1; A first on even k
    k = np.arange(pairs)
    slot_a = 2 * k + (k % 2)
    slot_b = 2 * k + 1 - (k % 2)
    log_a = base + own_a + slot_a[None, None, :, None] * model.drift
    log_b = base + own_b + slot_b[None, None, :, None] * model.drift
    if starts:
        log_a += rng.standard_normal((tables, points, 1, n_m)) * model.start
        log_b += rng.standard_normal((tables, points, 1, n_m)) * model.start
    effect = np.broadcast_to(np.asarray(effect_pct, float), (tables, points, n_m))
    log_b += np.log1p(effect / 100)[:, :, None, :]
    # (tables, points, pairs, metrics) -> (tables, points, metrics, pairs)
    a = level * np.exp(np.moveaxis(log_a, 3, 2))
    b = level * np.exp(np.moveaxis(log_b, 3, 2))
    return a, b


def draw_starts(
    model: NoiseModel,
    rng: np.random.Generator,
    *,
    tables: int,
    points: int,
    starts: int,
    repeats: int,
    effect_pct: np.ndarray | float = 0.0,
    kind: str = "normal",
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic tables measured in server starts: (a, b) of shape (tables, points, metrics,
    starts, repeats). Each start is one ``draw`` of ``repeats`` interleaved pairs with its
    own server-start offsets per side, as a round of a serve job starts both servers afresh."""
    drawn = [
        draw(
            model,
            rng,
            tables=tables,
            points=points,
            pairs=repeats,
            effect_pct=effect_pct,
            kind=kind,
        )  # fmt: skip
        for _ in range(starts)
    ]
    return np.stack([x for x, _ in drawn], axis=-2), np.stack([y for _, y in drawn], axis=-2)


def _nearest_pd(corr: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh(corr)
    fixed = vectors @ np.diag(np.clip(values, 1e-6, None)) @ vectors.T
    scale = np.sqrt(np.diag(fixed))
    return fixed / np.outer(scale, scale)


def table_markdown(models: Sequence[NoiseModel]) -> str:
    """One line per model and metric: the spreads in % of the level."""
    rows = []
    for model in models:
        for j, m in enumerate(model.metrics):
            rows.append(
                {
                    "model": model.name,
                    "metric": m,
                    "own %": f"{100 * model.own[j]:.2f}",
                    "shared %": f"{100 * model.shared[j]:.2f}",
                    "start %": f"{100 * model.start[j]:.2f}",
                    "drift %/slot": f"{100 * model.drift[j]:+.3f}",
                    "kurtosis": f"{_kurtosis(model.residuals[:, j]):.1f}",
                }
            )
    buf = io.StringIO()
    pd.DataFrame(rows).to_markdown(buf, index=False)
    return buf.getvalue()
