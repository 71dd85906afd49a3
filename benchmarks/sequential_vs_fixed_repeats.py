"""Does stopping repeats once a point's verdict is settled reach the verdicts of a fixed number
of repeats (the cap) in at most half the repeats, with the false-change rate held? (issue 32
item 3)

Simulated: A/A tables and tables with TPOT worse by 30% or 50% at one point, 4 points x 4
metrics, on each noise model of ``benchmarks/noise_models.py`` (normal and resampled draws),
caps of 10 and 20 pairs. For each: ``cellbench.stats.sequential.simulate`` (the stopping rule)
against the report's paired verdicts on all cap pairs (``stats.table_verdicts``, Holm), and a
plain paired t-test re-run after every pair until p < 0.05 (what the rule is not).

Real: the committed H200 runs' pairs through ``sequential.decide`` (the function the serve
stage calls), per point: each run alone (cap 3, all it measured) and the three runs' pairs in
time order as one sequence (cap 9; three server starts, so restart noise is inside it).

    .venv/bin/python benchmarks/sequential_vs_fixed_repeats.py [--tables 2000] [--out PREFIX]

writes PREFIX.json and PREFIX.md and prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from cellbench.stats import calibration, noise, sequential  # noqa: E402
from cellbench.stats import core as stats  # noqa: E402

POINTS = 4
METRICS = list(noise.METRICS)
TPOT = METRICS.index("mean_tpot_ms")


def naive_rows_called(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: did a plain paired t-test, re-run after every pair from 2 on, ever reach
    p < 0.05? (No Holm, no restart noise, no spending.)"""
    d = np.log(b) - np.log(a)
    ever = np.zeros(d.shape[:-1], bool)
    for n in range(2, d.shape[-1] + 1):
        x = d[..., :n]
        se = x.std(axis=-1, ddof=1) / np.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = 2 * sps.t.sf(np.abs(x.mean(axis=-1) / se), n - 1)
        ever |= p < 0.05
    return ever


def simulated(models, tables: int, seed: int) -> list[dict]:
    higher = np.tile(calibration.HIGHER, POINTS)
    out = []
    for model in models:
        for kind in ("normal", "empirical"):
            for cap in (10, 20):
                design = sequential.Design(rows=POINTS * len(METRICS), cap=cap)
                for effect in (0.0, 30.0, 50.0):
                    e = np.zeros((tables, POINTS, len(METRICS)))
                    e[:, 0, TPOT] = effect
                    rng = np.random.default_rng(seed)
                    a, b = noise.draw(model, rng, tables=tables, points=POINTS, pairs=cap,
                                      effect_pct=e, kind=kind)  # fmt: skip
                    a, b = calibration._flat(a), calibration._flat(b)
                    seq = sequential.simulate(a, b, higher, design, POINTS)
                    fixed = stats.table_verdicts(a, b, higher, test=stats.PAIRED)
                    # rows with no real change: all in an A/A table, all but TPOT of point 0
                    null = np.ones(higher.shape, bool)
                    if effect:
                        null[TPOT] = False
                    k_seq = int((seq["codes"][:, null] != 0).any(axis=1).sum())
                    k_fix = int((fixed[:, null] != 0).any(axis=1).sum())
                    lo, hi = calibration.clopper_pearson(k_seq, tables)
                    status = np.bincount(seq["status"].ravel(), minlength=5) / seq["status"].size
                    row = {
                        "model": model.name, "kind": kind, "cap": cap, "effect_tpot_pct": effect,
                        "pairs_used_share": round(float(seq["pairs"].mean()) / cap, 3),
                        "agree_all_rows": round(float((seq["codes"] == fixed).mean()), 4),
                        "fcr_sequential": round(k_seq / tables, 4),
                        "fcr_sequential_ci": [round(lo, 4), round(hi, 4)],
                        "fcr_fixed": round(k_fix / tables, 4),
                        "naive_row_rate": round(
                            float(naive_rows_called(a, b)[:, null].mean()), 4
                        ),
                        "stopped_as": {
                            name: round(float(v), 4)
                            for name, v in zip(
                                (*sequential.SETTLED, sequential.CAP), status, strict=True
                            )
                        },
                    }  # fmt: skip
                    if effect:
                        row["power_sequential"] = round(
                            float(np.mean(seq["codes"][:, TPOT] == -1)), 4
                        )
                        row["power_fixed"] = round(float(np.mean(fixed[:, TPOT] == -1)), 4)
                        row["agree_changed_row"] = round(
                            float(np.mean(seq["codes"][:, TPOT] == fixed[:, TPOT])), 4
                        )
                    out.append(row)
    return out


def real(frame: pd.DataFrame) -> list[dict]:
    """``sequential.decide`` on the committed runs' pairs, point by point, pair by pair."""
    both = noise.pairs(frame).sort_values(["run", *noise.POINT, "repeat"])
    higher = dict(noise.METRICS)
    out = []
    sequences = [(run, part) for run, part in both.groupby("run")]
    sequences.append(("all three runs in time order", both.sort_values("seq_a")))
    for label, part in sequences:
        cap = int(part.groupby(noise.POINT).size().max())
        design = sequential.Design(rows=POINTS * len(METRICS), cap=cap)
        fixed_rows = []
        for point, p in part.groupby(noise.POINT):
            p = p.sort_values(["run", "repeat"]) if label.startswith("all") else p
            values = {
                m: (np.exp(p[f"{m}_a"]).tolist(), np.exp(p[f"{m}_b"]).tolist()) for m in METRICS
            }
            for n in range(1, cap + 1):
                step = sequential.decide(
                    {m: (va[:n], vb[:n]) for m, (va, vb) in values.items()}, higher, design
                )
                if step["action"] == "stop":
                    break
            fixed_rows.append((point, values))
            out.append(
                {
                    "sequence": label, "point": "-".join(map(str, point)), "cap": cap,
                    "pairs_used": step["pairs"], "reason": step["reason"],
                    "metrics": {m: s["status"] for m, s in step["metrics"].items()},
                    "verdicts": {m: s["verdict"] for m, s in step["metrics"].items()},
                }
            )  # fmt: skip
        # the report's verdicts on every pair of the sequence (Holm over its 16 rows)
        a = np.array([[v[m][0] for m in METRICS] for _, v in fixed_rows]).reshape(-1, cap)
        b = np.array([[v[m][1] for m in METRICS] for _, v in fixed_rows]).reshape(-1, cap)
        codes = stats.table_verdicts(a[None], b[None], np.tile(calibration.HIGHER, POINTS),
                                     test=stats.PAIRED)[0]  # fmt: skip
        names = {1: stats.BETTER, -1: stats.WORSE, 0: stats.NOISE}
        for i, row in enumerate(o for o in out if o["sequence"] == label):
            fixed = {m: names[int(codes[i * len(METRICS) + j])] for j, m in enumerate(METRICS)}
            row["fixed_verdicts"] = fixed
            row["same_as_fixed"] = fixed == row["verdicts"]
    return out


def markdown(result: dict) -> str:
    sim = pd.DataFrame(result["simulated"])
    view = sim[["model", "kind", "cap", "effect_tpot_pct", "pairs_used_share", "fcr_sequential",
                "fcr_fixed", "naive_row_rate", "agree_all_rows"]].copy()  # fmt: skip
    view["fcr_sequential_ci"] = sim["fcr_sequential_ci"].map(lambda c: f"[{c[0]}, {c[1]}]")
    changed = sim[sim.effect_tpot_pct > 0][
        [
            "model",
            "kind",
            "cap",
            "effect_tpot_pct",
            "power_sequential",
            "power_fixed",
            "agree_changed_row",
            "pairs_used_share",
        ]  # fmt: skip
    ]
    real_rows = pd.DataFrame(result["real"])
    real_rows["metrics settled as"] = real_rows["metrics"].map(
        lambda ms: ", ".join(f"{k} {v}" for k, v in pd.Series(ms).value_counts().items())
    )
    real_view = real_rows[
        ["sequence", "point", "cap", "pairs_used", "reason", "metrics settled as", "same_as_fixed"]
    ]
    s = result["headline"]
    return "\n".join(
        [
            f"# Sequential repeats against a fixed number ({result['date']})",
            "",
            "Written by `benchmarks/sequential_vs_fixed_repeats.py` "
            f"({result['tables']} simulated tables per row, seed {result['seed']}); noise models "
            "fitted to the committed H200 runs (`noise_models_2026-12-05.md`); floor "
            f"{result['floor_pct']}%; tables of 4 points x 4 metrics; the rule: "
            "`cellbench.stats.sequential` (looks at 2, 3, 4, 6, 8, ... pairs, alpha spent as "
            f"(n/cap)^{sequential.RHO:g}, union bound over looks, futility at the optimistic 90% "
            "bound).",
            "",
            "## Headline",
            "",
            f"- Pairs used, share of the cap, over all simulated rows: {s['pairs_used_min']} to "
            f"{s['pairs_used_max']} (A/A: {s['pairs_used_aa_max']} at most).",
            f"- False-change rate per table (rows with no real change): sequential at most "
            f"{s['fcr_sequential_max']}, fixed at the cap at most {s['fcr_fixed_max']}; a plain "
            f"t-test re-run after every pair called {s['naive_min']}-{s['naive_max']} of "
            "no-change rows (a single row, before any Holm).",
            f"- Same verdict as fixed-N at the cap: {s['agree_all_min']}-{s['agree_all_max']} of "
            f"all rows; on the changed row {s['agree_changed_min']}-{s['agree_changed_max']}: "
            f"sequential power {s['power_seq_range']} against fixed {s['power_fixed_range']} "
            "(the price of the union bound over looks and of futility stops).",
            f"- Real runs: {s['real_same']} of {s['real_points']} point sequences got the same "
            "verdicts as all their pairs with Holm (all within noise: nothing there to call). "
            f"Each run alone (3 pairs a point, cap 3): {s['real_single_used']} of "
            f"{s['real_single_cap']} pairs; the three runs' pairs as one sequence (cap 9): "
            f"{s['real_joined_used']} of {s['real_joined_cap']}.",
            "",
            "## Simulated: stopping, false changes, agreement",
            "",
            view.to_markdown(index=False),
            "",
            "## Simulated: the changed row (TPOT worse at point 0)",
            "",
            changed.to_markdown(index=False),
            "",
            "## Real runs (committed H200 pairs through `sequential.decide`)",
            "",
            real_view.to_markdown(index=False),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = dt.date.today().isoformat()
    parser.add_argument("--tables", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", default=f"benchmarks/results/sequential_vs_fixed_repeats_{today}")
    args = parser.parse_args(argv)
    frame = noise.committed_runs(ROOT)
    models = [noise.fit(frame, "h200-all")]
    for c in sorted(frame.max_concurrency.unique()):
        models.append(noise.fit(frame[frame.max_concurrency == c], f"h200-c{c}"))
    sim = simulated(models, args.tables, args.seed)
    rl = real(frame)
    df = pd.DataFrame(sim)
    ch = df[df.effect_tpot_pct > 0]
    headline = {
        "pairs_used_min": float(df.pairs_used_share.min()),
        "pairs_used_max": float(df.pairs_used_share.max()),
        "pairs_used_aa_max": float(df[df.effect_tpot_pct == 0].pairs_used_share.max()),
        "fcr_sequential_max": float(df.fcr_sequential.max()),
        "fcr_fixed_max": float(df.fcr_fixed.max()),
        "naive_min": float(df.naive_row_rate.min()),
        "naive_max": float(df.naive_row_rate.max()),
        "agree_all_min": float(df.agree_all_rows.min()),
        "agree_all_max": float(df.agree_all_rows.max()),
        "agree_changed_min": float(ch.agree_changed_row.min()),
        "agree_changed_max": float(ch.agree_changed_row.max()),
        "power_seq_range": f"{ch.power_sequential.min()}-{ch.power_sequential.max()}",
        "power_fixed_range": f"{ch.power_fixed.min()}-{ch.power_fixed.max()}",
        "real_points": len(rl),
        "real_same": sum(r["same_as_fixed"] for r in rl),
        "real_single_used": sum(r["pairs_used"] for r in rl if r["cap"] == 3),
        "real_single_cap": sum(r["cap"] for r in rl if r["cap"] == 3),
        "real_joined_used": sum(r["pairs_used"] for r in rl if r["cap"] != 3),
        "real_joined_cap": sum(r["cap"] for r in rl if r["cap"] != 3),
    }
    result = {
        "date": today, "tables": args.tables, "seed": args.seed,
        "floor_pct": stats.DEFAULT_MIN_CHANGE_PCT, "headline": headline,
        "simulated": sim, "real": rl,
    }  # fmt: skip
    text = markdown(result)
    out = ROOT / args.out
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
