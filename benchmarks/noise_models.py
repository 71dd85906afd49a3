"""How noisy is a serving comparison, and where does the noise come from?

Fits ``cellbench.stats.noise`` models to every committed run that measured both arms with repeats
(``noise.COMMITTED_RUNS``: the three H200 runs of the local runtime, transformers serve, 3
interleaved repeats per point) and writes a summary: per metric the spread of one measurement
given its pair (own), of what a pair shares (shared), of one server start (start), the drift
per measurement slot, how own/start depend on concurrency and on the grid point (output
length), the request-level spread inside one point, an F test of the start part, and the
verdict floor they imply (the largest spread of the difference of two server starts,
sqrt(2) x start, over the models and metrics).

    .venv/bin/python benchmarks/noise_models.py [--out benchmarks/results/noise_models_DATE]

writes OUT.json and OUT.md and prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from cellbench.stats import noise  # noqa: E402


def models(frame: pd.DataFrame) -> list[noise.NoiseModel]:
    runs = ", ".join(sorted(frame.run.unique()))
    out = [noise.fit(frame, "h200-all", f"{runs}; all points")]
    for c in sorted(frame.max_concurrency.unique()):
        part = frame[frame.max_concurrency == c]
        out.append(noise.fit(part, f"h200-c{c}", f"{runs}; concurrency {c} only"))
    return out


def summary(frame: pd.DataFrame) -> dict:
    fitted = models(frame)
    request = (
        frame.groupby("max_concurrency")[["ttft_request_cv", "tpot_request_cv"]]
        .median()
        .mul(100)
        .round(1)
    )
    # Day-level drift: each run's level (both arms, log mean per point) against the mean of
    # all runs at that point, averaged over points, in %.
    logs = frame.assign(**{m: np.log(frame[m].astype(float)) for m in noise.METRICS})
    per_run = logs.groupby(["run", *noise.POINT])[list(noise.METRICS)].mean()
    centred = per_run - per_run.groupby(level=noise.POINT).transform("mean")
    level = (100 * centred.groupby(level="run").mean()).round(2)
    started = frame.groupby("run")["started_at"].min()
    level.insert(0, "first measurement", started)
    return {
        "run_level_pct": level.sort_values("first measurement").reset_index().to_dict("records"),
        "what": "noise models of serving measurements (cellbench.stats.noise)",
        "sources": [{"run": label, "path": where} for label, where, _ in noise.COMMITTED_RUNS],
        "measurements": len(frame),
        "data_sha256": hashlib.sha256(frame.to_csv(index=False).encode()).hexdigest(),
        "models": [m.summary() for m in fitted],
        "restart_F_test": noise.restart_test(frame),
        "by_concurrency": noise.by_group(frame, ["max_concurrency"]).to_dict("records"),
        "by_point": noise.by_group(frame, ["isl", "osl"]).to_dict("records"),
        "request_cv_pct_by_concurrency": request.reset_index().to_dict("records"),
    }


def markdown(s: dict, fitted: list[noise.NoiseModel]) -> str:
    lines = [
        f"# Noise models of serving measurements ({s['date']})",
        "",
        "Written by `benchmarks/noise_models.py` from the committed runs with repeats of both",
        "arms (`cellbench.stats.noise.COMMITTED_RUNS`):",
        "",
        *[f"- {r['run']}: `{r['path']}`" for r in s["sources"]],
        "",
        f"{s['measurements']} measurements (2 arms x 4 points x 3 repeats x 3 runs; one H200,",
        "`transformers serve`, random-weight Qwen3-30B-A3B-shaped model, `config/gpu-local.yaml`).",
        "No real-vLLM run with repeats and no rehearsal container run is committed yet, so these",
        "are the only models; a new run is added to `COMMITTED_RUNS` and this script rerun.",
        "",
        "Log-scale spreads in % of the level. own: one measurement given its interleaved pair;",
        "shared: what both arms of one pair share (cancels in a paired test, not in Welch's);",
        "start: one server start's offset (fixed for all repeats of an arm in one run, so only",
        "separate runs show it); drift: trend per measurement slot (each pair takes two slots).",
        "",
        noise.table_markdown(fitted),
        "",
        "Is there a server-start part? F = between-run variance of the per-run mean log-ratio",
        "over what the repeats alone give it:",
        "",
    ]
    for m, t in s["restart_F_test"].items():
        lines.append(f"- {m}: F = {t['F']} on {t['df']} degrees of freedom, p = {t['p']:.3g}")
    lines += [
        "",
        "The start part is an estimate from 3 runs (8 degrees of freedom): F near 1.5 with",
        "p about 0.2 means these runs cannot tell it from zero either; its point estimate is used",
        "(the floor below), and more runs of the same config would narrow it. The c1/c16",
        "drift figures rest on 3 pairs a run and change sign between subsets: no drift inside a",
        "run is shown by these data (h200-all: at most 0.2% per slot).",
        "",
        "Level of each run (both arms; log mean per point against the three runs' mean at that",
        "point, averaged over points, %): the drift between runs hours apart.",
        "",
        pd.DataFrame(s["run_level_pct"]).to_markdown(index=False),
    ]
    lines += [
        "",
        "By concurrency (own and start, %):",
        "",
        pd.DataFrame(s["by_concurrency"]).to_markdown(index=False),
        "",
        "By grid point (ISL-OSL; the output length changes with it), own and start, %:",
        "",
        pd.DataFrame(s["by_point"]).to_markdown(index=False),
        "",
        "Request-level spread inside one point (std / mean of the point's requests, median, %):",
        "",
        pd.DataFrame(s["request_cv_pct_by_concurrency"]).to_markdown(index=False),
        "",
        "These models are what the verdicts' error rates are simulated on "
        "(`tests/unit/test_calibration.py`, `benchmarks/sequential_vs_fixed_starts.py`); no "
        "verdict takes a variance from them: each run measures its own between its starts.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = dt.date.today().isoformat()
    parser.add_argument("--out", default=f"benchmarks/results/noise_models_{today}")
    args = parser.parse_args(argv)
    frame = noise.committed_runs(ROOT)
    s = {"date": today, **summary(frame)}
    text = markdown(s, models(frame))
    out = ROOT / args.out
    out.with_suffix(".json").write_text(json.dumps(s, indent=1, default=float) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
