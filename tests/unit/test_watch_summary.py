"""What `cellbench watch`'s summary reads: failed gate checks from gate.json, and the change
points that start at the newest run of a history (files written here; no registry, no run)."""

from __future__ import annotations

import json

import pandas as pd
from cellbench.config.loader import Cell
from cellbench.watch import watch


def test_failed_gate_checks_are_named_and_passed_ones_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = Cell("rocm7.2", "m", 1, 1)
    gate = tmp_path / cell.path / "gate.json"
    gate.parent.mkdir(parents=True)
    checks = [
        {"check": "floor", "arm": "tuned", "metric": "strict_match", "value": 0.7,
         "limit": 0.8, "passed": False},
        {"check": "floor", "arm": "untuned", "metric": "strict_match", "value": 0.9,
         "limit": 0.8, "passed": True},
    ]  # fmt: skip
    gate.write_text(json.dumps({"kind": "gate", "checks": checks}))
    lines = watch.failed_gates([cell, Cell("rocm7.2", "other", 1, 1)])
    assert lines == [
        "GSM8K gate failed: rocm7.2/m/tp1-ep1 tuned strict_match floor value 0.7000 limit 0.8000"
    ]


def test_only_change_points_at_the_newest_run_are_new(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "results/history/rocm7.2"
    folder.mkdir(parents=True)
    pd.DataFrame({"run": ["r1", "r2", "r3"], "time": ["1", "2", "3"]}).to_csv(
        folder / "history.csv", index=False
    )
    points = pd.DataFrame(
        {"cell": ["c", "c"], "arm": ["tuned", "tuned"], "point": ["64-16 c2"] * 2,
         "metric": ["mean_tpot_ms", "mean_ttft_ms"], "run": ["r2", "r3"],
         "pvalue": [0.001, 0.002], "shift_pct": [12.0, -30.0]}
    )  # fmt: skip
    points.to_csv(folder / "change_points.csv", index=False)
    lines = watch.new_change_points(["rocm7.2", "rocm7.0"])
    assert lines == [
        "change point (Otava) at this run: c tuned 64-16 c2 mean_ttft_ms -30.0% p=0.002"
    ]
