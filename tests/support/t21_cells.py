"""A small finished cell for the tidy-table and figure tests, written by result_fixtures (the
stages' own formats, checksums included), with a tuner baseline and roofline like the tuner's."""

from __future__ import annotations

import json
from pathlib import Path

from cellbench.common import atomicio

from support import result_fixtures as fx

CELL = "rocm7.2/tiny-a/tp1-ep1"
GRID = [(128, 32), (512, 64)]
REPEATS = 3
BATCH_SIZES = (1, 4, 16)
# baseline time per M (us); the pick is timed at half of it beside it, so the speed-up is 2.
BASELINE_US = {1: 80.0, 4: 120.0, 16: 300.0}


def evidence(arm: str) -> dict:
    """What a server's log showed, as moe_evidence records it: the tuned arm loaded its file,
    the untuned arm ran vLLM's default rule."""
    path = f"/cellbench/tuned-configs/{fx.CONFIG_FILE}"
    if arm == "tuned":
        return {"source": "tuned", "paths": [path], "searched": [], "env": {},
                "log_lines": [f"Using configuration from {path} for MoE layer."]}  # fmt: skip
    return {"source": "default", "paths": [], "searched": [], "env": {},
            "log_lines": ["Using default MoE config. Config file not found at x.json"]}  # fmt: skip


def write_cell(results: Path, cell: str = CELL, tuned_factor: float = 0.9) -> None:
    """Tune summary (with baselines and rooflines), both arms' bench.json (GRID x REPEATS)
    and GSM8K results (10 questions; the tuned arm fixes question 0 and breaks question 1)."""
    summary_path = fx.write_tune(results, cell, BATCH_SIZES)
    summary = json.loads(summary_path.read_text())
    for m, entry in summary["entries"].items():
        base = BASELINE_US[int(m)]
        entry["baseline"] = {
            "source": "default",
            "config": {
                "BLOCK_SIZE_M": 16,
                "BLOCK_SIZE_N": 32,
                "BLOCK_SIZE_K": 64,
                "GROUP_SIZE_M": 1,
            },  # fmt: skip
            "same_as_tuned": False,
            "time_us": base,
            "tuned_time_us": base / 2,
        }
        entry["improvement_pct"] = 50.0
        entry["roofline"] = {"fused": {"roofline_fraction": 0.1 * int(m) ** 0.5}}
    atomicio.write_json(summary_path, summary, checksum=True)
    for arm, factor in (("untuned", 1.0), ("tuned", tuned_factor)):
        points = []
        for repeat in range(REPEATS):
            for isl, osl in GRID:
                points.append(
                    fx.point(
                        isl,
                        osl,
                        repeat=repeat,
                        start=repeat,  # each repeat its own server start
                        seq=2 * len(points) + (arm == "tuned"),  # the arms interleaved
                        ttft=factor * (100.0 + isl / 10 + repeat),
                        tpot=factor * (20.0 + repeat),
                    )  # fmt: skip
                )
        fx.write_bench(results, cell, arm, points, moe_config=evidence(arm))
    untuned = [True, False] + [True] * 4 + [False] * 4
    tuned = [False, True] + [True] * 4 + [False] * 4
    for arm, correct in (("untuned", untuned), ("tuned", tuned)):
        fx.write_gsm8k(results, cell, arm, correct)
