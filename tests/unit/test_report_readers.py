"""What the report tells its readers about what ran: the vLLM version each arm's server gave,
the arms' columns named by what served them, and a tuner table whose gain agrees with the
times beside it and which says what the tune timed itself.

Stage results are written here with chosen values (tests/support/result_fixtures.py) and read
by the report's own loader and renderer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cellbench.common import atomicio
from cellbench.report import build as report
from cellbench.report import frames, percentile_claims, pr_markdown, sections
from support import result_fixtures as fx

CELL = "vllm-nightly/tiny-qwen3-moe/tp1-ep1"
NONE_SEEN = {"source": "none seen", "paths": [], "searched": [], "log_lines": [], "env": {}}


def _vllm_bench(res: Path, arm: str, version: str | None, moe: dict | None = None) -> Path:
    server = {
        "launcher": "docker", "model": "m", "model_id": "m", "ready_s": 1.0,
        "command": ["vllm", "serve", "/models/m"],
        "version": {"observed_from": "GET /version", "version": version},
    }  # fmt: skip
    pts = [fx.point(repeat=r, seq=r, ttft=50.0 + r) for r in range(3)]
    return fx.write_bench(
        res, CELL, arm, pts, moe_config=moe or NONE_SEEN, arm_label=arm, server=server
    )


def _render(files: list[Path], res: Path) -> str:
    return report.render(*report.cell_frames(report.load_inputs(files, res)), runtime="docker")


def test_the_first_report_names_the_vllm_each_server_gave(tmp_path):
    res = tmp_path / "results"
    both = [_vllm_bench(res, arm, "0.31.0") for arm in ("untuned", "tuned")]
    text = _render(both, res)
    line = (
        "Served by vLLM 0.31.0 (both arms), as each arm's running server answered `GET /version`."
    )
    assert line in text, text[:1500]
    # a server that gave none is named as such, per arm
    _vllm_bench(res, "tuned", None)
    text = _render(both, res)
    assert "Served by untuned: vLLM 0.31.0; tuned: a server that gave no version" in text


def test_arms_that_ran_no_triton_moe_are_not_headed_triton_moe(tmp_path):
    """vLLM's CPU backend logged no fused-MoE config (none seen): every table of the cell, the
    GSM8K one included, names the arms by the program that served them."""
    res = tmp_path / "results"
    files = [_vllm_bench(res, arm, "0.31.0") for arm in ("untuned", "tuned")]
    for bench in files:
        fx.write_requests(bench)
    files += [fx.write_gsm8k(res, CELL, arm, [True, False, True]) for arm in ("untuned", "tuned")]
    loaded = report.load_inputs(files, res)
    claims = percentile_claims.claims_frame(loaded, {"ttft_ms": 100})
    text = report.render(*report.cell_frames(loaded), runtime="docker", claims=claims)
    assert "| 512-512 | c16 | Untuned (vLLM, no Triton MoE) | TTFT |" in text, text
    assert "Triton MoE" not in text.replace("no Triton MoE", ""), text
    assert "| ISL-OSL   | Untuned (vLLM, no Triton MoE)   | Tuned (vLLM, no Triton MoE)   |" in text
    gsm_header = next(x for x in text.splitlines() if x.startswith("| Metric "))
    assert "Untuned (vLLM, no Triton MoE)" in gsm_header, gsm_header
    # the PR-ready file's tables too
    serve, gsm, _ = report.cell_frames(report.load_inputs(files, res))
    assert pr_markdown.metric_table(serve, CELL, "mean_ttft_ms")[0][1:] == [
        "Untuned (vLLM, no Triton MoE)", "Tuned (vLLM, no Triton MoE)",
    ]  # fmt: skip
    labels = frames.arm_columns(serve, CELL)
    assert pr_markdown.gsm8k_table(gsm, CELL, labels)[0][1] == "Untuned (vLLM, no Triton MoE)"


def _tune(res: Path, entries: dict, **summary) -> Path:
    path = fx.write_tune(res, CELL, batch_sizes=tuple(int(m) for m in entries))
    data = json.loads(path.read_text())
    data["entries"] = entries
    data.update(summary)
    atomicio.write_json(path, data, checksum=True)
    return path


def _entry(search_us: float, base_us: float, pick_us: float) -> dict:
    """An entry as the tuner writes it: the gain from the side-by-side times, and the keep
    rule's swap where the pick was no faster side by side."""
    entry = {
        "config": dict(fx.CONFIG), "time_us": search_us, "kept": "pick",
        "baseline": {"source": "default", "config": dict(fx.CONFIG), "time_us": base_us,
                     "tuned_time_us": pick_us},
        "improvement_pct": 100.0 * (base_us - pick_us) / base_us,
    }  # fmt: skip
    if pick_us >= base_us:  # the keep rule: the baseline's config, the pick kept aside
        entry.update(kept="baseline", time_us=base_us,
                     tuned_pick={"config": dict(fx.CONFIG), "time_us": search_us})  # fmt: skip
    return entry


def _tune_rows(text: str) -> list[dict[str, str]]:
    lines = text.split("#### Tuned configs:")[1].splitlines()
    table = [x for x in lines if x.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(header, [c.strip() for c in x.strip("|").split("|")], strict=True))
            for x in table[2:]]  # fmt: skip


def test_the_tuner_tables_gain_agrees_with_the_times_beside_it(tmp_path):
    """A pick the search timed slower than the baseline (M=1; interpreter noise under load did
    this on the rehearsal) shows a negative gain, though its side-by-side time was faster; a
    pick slower side by side (M=4) shows the baseline kept and the pick's own search time; a
    pick faster in both (M=16) shows its gain. No row shows a pick slower than the baseline,
    in either of its times, with a positive gain."""
    res = tmp_path / "results"
    entries = {"1": _entry(80.0, 60.0, 32.0), "4": _entry(90.0, 100.0, 120.0),
               "16": _entry(40.0, 50.0, 45.0)}  # fmt: skip
    files = [
        _tune(
            res, entries,
            counts={"timed": 11, "reused": 0, "pruned": 8, "failed": 0, "new_kernels": 8},
            resumed_log_records=0,
            log={"resumed_records": 0, "set_aside_records": 27, "set_aside_because": "x"},
        )
    ]  # fmt: skip
    text = _render(files, res)
    rows = _tune_rows(text)
    assert [r["M"] for r in rows] == ["1", "4", "16"] and "time_us" not in rows[0]
    for r in rows:
        base, gain = float(r["baseline_us"]), float(r["gain %"])
        slower = max(float(r["pick_us"]), float(r["search_us"]))
        assert (gain > 0) == (slower < base), r
        assert gain == pytest.approx(100 * (base - slower) / base, abs=0.05), r
    assert (rows[0]["search_us"], rows[0]["gain %"], rows[0]["kept"]) == ("80.000", "-33.3", "pick")
    assert (rows[1]["search_us"], rows[1]["kept"]) == ("90.000", "baseline")
    assert rows[2]["gain %"] == "10.0"
    assert sections.TUNE_NOTE in text
    assert "This run timed 11 candidates and compiled 8 new kernels; an earlier run's log" in text
    assert "(27 records, another image's) was not resumed." in text
