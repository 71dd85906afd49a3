"""How much of a decode step the fused-MoE kernel can be, from a finished gpu_local run.

For each grid point and arm: the measured TPOT (mean over repeats, and the spread between
repeats) beside the tuned kernel's own time for one MoE call at the decode batch (the point's
concurrency), times the model's MoE layers. That bound says how much a better launch config
could move TPOT at all; where it is far below the repeats' spread, no verdict can see it.

    python benchmarks/gpu_local/moe_share.py benchmarks/results/gpu_local_h200_2026-12-04/results
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(results: Path) -> None:
    (cell,) = [p.parent.parent for p in results.glob("*/*/*/tune/summary.json")]
    summary = json.loads((cell / "tune" / "summary.json").read_text())
    layers = 8  # small-qwen3-moe: every layer sparse (cellbench.assets.build.SMALL_MODEL_SHAPE)
    times = {int(m): e["time_us"] for m, e in summary["entries"].items()}
    print(f"cell {cell.relative_to(results)}; tuned kernel time per MoE call (us): {times}")
    print("point (isl-osl @c) | arm | TPOT mean (min-max over repeats), ms | MoE bound, ms | share")
    for arm in ("untuned", "tuned"):
        bench = json.loads((cell / "serve" / arm / "bench.json").read_text())
        points: dict[tuple[int, int, int], list[float]] = {}
        for p in bench["points"]:
            key = (p["isl"], p["osl"], p["max_concurrency"])
            points.setdefault(key, []).append(p["mean_tpot_ms"])
        for (isl, osl, conc), tpot in sorted(points.items()):
            m = min(times, key=lambda k: abs(k - conc))  # nearest tuned batch size
            bound = layers * times[m] / 1000.0
            mean = statistics.mean(tpot)
            print(
                f"{isl}-{osl} @c{conc} | {arm} | {mean:.2f} ({min(tpot):.2f}-{max(tpot):.2f}) | "
                f"{bound:.2f} | {100 * bound / mean:.1f}%"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
