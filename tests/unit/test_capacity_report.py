"""The report's capacity section (cellbench.report.capacity) from recorded searches: the
headline's wording and numbers, a config whose bound no load met, capacity.csv and the
figure (files written, as the report job writes them)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from cellbench.contracts import result_file
from cellbench.contracts.result_file import Result
from cellbench.report import capacity as report_capacity
from cellbench.serve import capacity

CELL = "host-cpu/tiny-qwen3-moe/tp1-ep1"
SLA = {"percentile": 90, "confidence": 99, "tpot_ms": 50, "start": 1, "max_concurrency": 256,
       "max_probes": 20, "points": []}  # fmt: skip


def _loaded(boundaries: dict[str, int], **sla) -> list[Result]:
    """Both arms' bench.json content with a search at 512-512 against recorded outcomes: TPOT
    p90 40 ms at or below the arm's boundary, 60 ms above; 2 s a probe."""
    cfg = {**SLA, **sla}

    def measure(side, isl, osl, conc, prompts, step):
        tpot = 40.0 if conc <= boundaries[side] else 60.0
        pt = {"failed": 0, "num_prompts": prompts, "completed": prompts, "duration": 2.0,
              "request_throughput": prompts / 2.0, "output_throughput": 10.0 * prompts}  # fmt: skip
        detail = {"ttfts": [0.1] * prompts, "latencies": [0.1 + 9 * tpot / 1000] * prompts,
                  "output_lens": [10] * prompts, "errors": [""] * prompts}  # fmt: skip
        return pt, detail

    found = capacity.run_search(cfg, list(boundaries), [{"isl": 512, "osl": 512}], measure, 0.0)
    return [
        Result(
            Path(f"{arm}/bench.json"),
            result_file.BENCH,
            {"cell": CELL, "arm": arm, "capacity": section},
            "0" * 64,
            True,
        )  # fmt: skip
        for arm, section in found.items()
    ]


def test_headline_names_both_capacities_the_change_the_verdict_and_goodput():
    lines = report_capacity.section_lines(_loaded({"untuned": 16, "tuned": 24}), CELL, 2.0)
    text = "\n".join(lines)
    assert (
        "ISL-OSL 512-512: tuned sustains 24 concurrent requests at p90 TPOT <= 50 ms, untuned 16 "
        "(+50%, better)." in text
    )
    # goodput at each arm's capacity: every request met the bound there, 44 in 2 s
    assert "untuned 22.00 req/s within the SLA (440.0 output tok/s) at 16" in text
    assert "tuned 22.00 req/s within the SLA (440.0 output tok/s) at 24" in text
    assert f"![capacity 512-512](capacity/{CELL}/512-512.png)" in text
    assert report_capacity.NOTE in text


def test_no_load_met_says_so_with_what_the_smallest_load_gave():
    text = "\n".join(report_capacity.section_lines(_loaded({"untuned": 0, "tuned": 0}), CELL, 2.0))
    for arm in ("untuned", "tuned"):
        assert (
            f"{arm}: no load met p90 TPOT <= 50 ms; the smallest probed load 1 gave TPOT 60.0 ms"
            in text
        )
    assert "Verdict: n/a (no load met the SLA on either arm)." in text


def test_same_code_shows_each_arm_and_no_verdict():
    loaded = _loaded({"untuned": 16, "tuned": 17})
    text = "\n".join(report_capacity.section_lines(loaded, CELL, 2.0, same_code=True))
    assert "untuned: sustains 16 concurrent requests" in text and "better" not in text
    assert report_capacity.SAME_CODE_NOTE in text


def test_capacity_csv_and_figures_are_written(tmp_path):
    written = report_capacity.write(_loaded({"untuned": 16, "tuned": 24}), tmp_path, 2.0)
    names = sorted(str(p.relative_to(tmp_path)) for p in written)
    assert names == [
        "capacity.csv",
        f"capacity/{CELL}/512-512.png",
        f"capacity/{CELL}/512-512.svg",
    ]
    table = pd.read_csv(tmp_path / "capacity.csv")
    assert list(table.arm) == ["tuned", "untuned"]
    assert list(table.capacity) == [24, 16] and list(table.first_fail) == [25, 17]
    assert set(table.verdict) == {"better"} and table.change_pct.iloc[0] == 50.0
    assert (tmp_path / f"capacity/{CELL}/512-512.png").stat().st_size > 1000
    # nothing searched: nothing written
    assert report_capacity.write([], tmp_path / "none", 2.0) == []


def test_the_results_loader_refuses_a_capacity_its_probes_do_not_give(tmp_path):
    from cellbench.results import loaders
    from support import result_fixtures as fx

    (good,) = [r.data["capacity"] for r in _loaded({"tuned": 5})]
    path = fx.write_bench(tmp_path, CELL, "tuned", [fx.point()], capacity=good)
    assert loaders.load_bench(path, tmp_path).data["capacity"]["points"][0]["capacity"] == 5
    entry = good["points"][0]
    bad = {**good, "points": [{**entry, "capacity": 8}]}
    path = fx.write_bench(tmp_path, CELL, "tuned", [fx.point()], capacity=bad)
    with pytest.raises(loaders.ResultError) as err:
        loaders.load_bench(path, tmp_path)
    assert "capacity.points[0].capacity = 8: 5 with first fail 6, as its probes give" in str(
        err.value
    )
