"""Server starts that stop once the answer is known against a fixed number of starts at the
cap, on simulated tables drawn from the noise models fitted to the committed runs
(``cellbench.stats.noise``).

Per scenario (noise model, cap, repeats per start, with or without an earlier run's
start-to-start variance) it draws tables of 4 grid points x 4 metrics, every start a fresh
server offset per side, and applies both rules to the same draws:

- the group-sequential rule (``sequential.simulate``: O'Brien-Fleming alpha spending over
  the looks at 2..cap starts, non-binding futility), and
- the fixed rule on all cap starts (``starts.fixed_verdicts``, Bonferroni over the table).

Three kinds of table: A/A (no change), one planted change at the design's stated
detectable change (TPOT, first point), and one at twice it. Reported: the starts the
sequential rule used as a share of the cap (mean over points), its false-change rate per
A/A table beside the fixed rule's, its power beside the fixed rule's, and how often the
two rules agree on each row's call (changed better / worse, or not).

    .venv/bin/python benchmarks/sequential_vs_fixed_starts.py

writes benchmarks/results/sequential_vs_fixed_starts.{md,json}. Numpy; about a minute.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from cellbench.stats import calibration, noise, sequential, starts  # noqa: E402

POINTS = 4
ROWS = POINTS * len(noise.METRICS)
METRIC = "mean_tpot_ms"
TABLES = 2000
HISTORY_DF = 30
OUT = ROOT / "benchmarks" / "results" / "sequential_vs_fixed_starts"


def models() -> list[noise.NoiseModel]:
    runs = noise.committed_runs(ROOT)
    out = [noise.fit(runs, "h200-all")]
    for c in sorted(runs.max_concurrency.unique()):
        out.append(noise.fit(runs[runs.max_concurrency == c], f"h200-c{c}"))
    return out


def design_mdc(model, cap: int, repeats: int, prior_df: int) -> float:
    design = sequential.Design(rows=ROWS, cap=cap)
    fixed = calibration.expected_mdc(model, METRIC, starts_=cap, repeats=repeats, rows=ROWS,
                                     prior_df=prior_df)  # fmt: skip
    return starts.as_pct(sequential.inflation(design) * math.log1p(fixed / 100))


def scenario(model, cap: int, repeats: int, history: bool, seed: int) -> list[dict]:
    prior_df = HISTORY_DF if history else 0
    kw = {}
    if history:
        kw = {"prior_var": calibration.row_variances(model, repeats, POINTS),
              "prior_df": prior_df}  # fmt: skip
    mdc = design_mdc(model, cap, repeats, prior_df)
    design = sequential.Design(rows=ROWS, cap=cap)
    higher = np.tile(calibration.HIGHER, POINTS)
    j = list(noise.METRICS).index(METRIC)
    out = []
    for kind, effect in (("A/A", 0.0), ("change = MDC", mdc), ("change = 2 x MDC", 2 * mdc)):
        rng = np.random.default_rng(seed)
        planted = np.zeros((TABLES, POINTS, len(noise.METRICS)))
        planted[:, 0, j] = effect
        a, b = noise.draw_starts(model, rng, tables=TABLES, points=POINTS, starts=cap,
                                 repeats=repeats, effect_pct=planted)  # fmt: skip
        fa, fb = calibration._flat(a), calibration._flat(b)
        seq = sequential.simulate(fa, fb, higher, design, POINTS, **kw)
        fixed = starts.fixed_verdicts(fa, fb, higher, **kw)
        called_seq = np.where(np.isin(seq["codes"], (1, -1)), seq["codes"], 0)
        called_fix = np.where(np.isin(fixed, (1, -1)), fixed, 0)
        row = {
            "model": model.name,
            "cap": cap,
            "repeats per start": repeats,
            "history": f"{prior_df} df" if history else "none",
            "tables": kind,
            "planted %": round(effect, 1),
            "starts used / cap": round(float(seq["starts"].mean()) / cap, 3),
            "agreement": round(float((called_seq == called_fix).mean()), 4),
        }
        if effect == 0:
            row["false-change seq"] = round(float((called_seq != 0).any(axis=1).mean()), 4)
            row["false-change fixed"] = round(float((called_fix != 0).any(axis=1).mean()), 4)
        else:  # TPOT is lower-is-better: a planted rise is called worse
            row["power seq"] = round(float((seq["codes"][:, j] == -1).mean()), 4)
            row["power fixed"] = round(float((fixed[:, j] == -1).mean()), 4)
        out.append(row)
    return out


def main() -> int:
    rows = []
    for m in models():
        for cap, repeats in ((8, 1), (8, 2), (12, 1)):
            for history in (False, True):
                rows += scenario(m, cap, repeats, history, seed=cap * 10 + repeats)
    frame = pd.DataFrame(rows)
    aa = frame[frame.tables == "A/A"]
    mean_share = float(frame["starts used / cap"].mean())
    headline = {
        "mean starts used / cap, all scenarios and tables": round(mean_share, 3),
        "max starts used / cap, any scenario": float(frame["starts used / cap"].max()),
        "max false-change rate seq": float(aa["false-change seq"].max()),
        "max false-change rate fixed": float(aa["false-change fixed"].max()),
        "min agreement": float(frame["agreement"].min()),
    }
    OUT.with_suffix(".json").write_text(
        json.dumps({"headline": headline, "rows": rows}, indent=1) + "\n"
    )
    text = [
        "# Sequential starts against fixed starts at the cap",
        "",
        "Written by `benchmarks/sequential_vs_fixed_starts.py`: simulated tables of 4 grid "
        f"points x 4 metrics, {TABLES} per row, drawn from the noise models fitted to the "
        "committed H200 runs (`cellbench.stats.noise`, every start its own server offsets). "
        "Both rules see the same draws. *MDC*: the design's stated detectable change for "
        f"{METRIC} (80% power; the fixed test's at the cap times the design's inflation); a "
        "planted change is TPOT worse at the first point. *history*: the start-to-start "
        f"variance of earlier runs with {HISTORY_DF} degrees of freedom pooled in. *agreement*: "
        "the share of rows both rules call the same (better, worse, or neither).",
        "",
        "Headline:",
        "",
        *[f"- {k}: {v}" for k, v in headline.items()],
        "",
        frame.to_markdown(index=False),
        "",
    ]
    OUT.with_suffix(".md").write_text("\n".join(text))
    print("\n".join(text[: 12 + len(headline)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
