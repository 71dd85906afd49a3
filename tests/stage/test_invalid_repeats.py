"""Invalid repeats are recorded, logged and counted, not fatal: a pair job against two real
timed servers, one of which buffers the stream of one repeat (all tokens in one chunk) or fails
half its requests in one repeat.

Stand-in, why: vLLM cannot run on a CPU-only CI machine; the timed server is a real HTTP server
told which of its requests to send in a burst (``--burst-requests``) or to fail, so which
repeat must come out invalid is known before the job runs. Request numbering per server: 0 the
readiness probe, 1 the ignore_eos probe, then per repeat 1 warm-up and 2 measured requests
(repeat r: requests 2+3r, 3+3r and 4+3r).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pandas as pd
from cellbench.config import detect_plan, loader
from cellbench.report import build as report
from cellbench.report import percentile_claims
from cellbench.serve import stage as serve_stage
from support import result_fixtures as fx
from support.stage_jobs import serve_argv

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
CELL = "host-cpu/timed/tp1-ep1"
ARMS = ("untuned", "tuned")


def _run(tmp_path: Path, tuned_flags: list[str], **fields) -> tuple[int, Path]:
    """A pair job, 3 repeats of 8-4 at c1 with 2 prompts; the tuned arm's server gets
    ``tuned_flags`` through the job's per-image command (both arms share one command, so the
    flags go to both: the untuned arm runs first in repeat 0 and 2, second in repeat 1, and
    request numbers count per server)."""
    tuned = tmp_path / "tune" / "configs"
    tuned.mkdir(parents=True, exist_ok=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    res = tmp_path / "results"
    job = {
        "runtime": "local",
        "cell_id": CELL,
        "arm": "pair",
        "model": "timed-model",
        # 5 ms per token: a client stalled for less than the 15 ms of a stream cannot make a
        # real stream look like a burst on this busy host
        "server_command": [*TIMED, "--ttft-ms", "2", "--itl-ms", "5", *tuned_flags],
        "grid": [{"isl": 8, "osl": 4}],
        "concurrency": [1],
        "prompts_per_concurrency": 2,
        "warmups_per_concurrency": 1,
        "repeats": 3,
        "gsm8k": False,
        "image_digest": "local:test",
        **fields,
    }
    host = {
        "tuned_config_dir": str(tuned),
        "lease_dir": str(tmp_path / "leases"),
        "cache_dir": str(tmp_path / "cache"),
    }
    rc = serve_stage.main(serve_argv(job, host, res / CELL / "serve"))
    return rc, res


def _points(res: Path, arm: str) -> list[dict]:
    bench = json.loads((res / CELL / "serve" / arm / "bench.json").read_text())
    jsonschema.validate(bench, SCHEMA)
    return sorted(bench["points"], key=lambda p: p["repeat"])


def _report(res: Path, out: Path, bounds: dict | None = None) -> str:
    files = [fx.write_tune(res, CELL)]
    for arm in ARMS:
        files += [res / CELL / "serve" / arm / "bench.json"]
        files += [fx.write_gsm8k(res, CELL, arm, [True, False])]
    return report.write_report(files, out, results=res, latency_bounds=bounds).read_text()


def test_a_burst_repeat_is_invalid_and_counted(tmp_path, capsys):
    # Requests 5-7 of each server are repeat 1's: sent as one chunk of 4 tokens each.
    rc, res = _run(tmp_path, ["--burst-requests", "5-8"])
    assert rc == 0
    err = capsys.readouterr().err
    assert err.count("invalid repeat:") == 2, err  # repeat 1 of each arm, on the terminal
    for arm in ARMS:
        points = _points(res, arm)
        assert [p["repeat"] for p in points] == [0, 1, 2]
        assert "invalid" not in points[0] and "invalid" not in points[2]
        why = points[1]["invalid"]
        assert "2 of 2 requests sent all their tokens (4 at most) in one chunk" in why, why
        assert f"{arm} isl=8 osl=4 c1 repeat 1: 2 of 2 requests" in err
    # A TPOT bound of 2 ms: the real streams (5 ms per token) are over it, the burst under.
    text = _report(res, tmp_path / "report", {"tpot_ms": 2})
    # Beside every verdict of the cell's arms table: one invalid repeat per side.
    cells = [[c.strip() for c in line.split("|")] for line in text.splitlines()]
    rows = [c for c in cells if len(c) > 2 and c[1] == "8-4" and "1/1" in c]
    assert len(rows) == 4, text  # TTFT, TPOT, E2EL, throughput
    assert "Invalid repeats, left out of the tests above: 2 of 2 requests sent" in text
    # The latency claims pool the valid repeats' requests only: 2 x 2, every one over.
    claims = pd.read_csv(tmp_path / "report" / percentile_claims.CSV_NAME)
    tpot = claims[claims.metric == "TPOT"].set_index("arm")
    for arm in ARMS:
        assert (tpot.loc[arm].queries, tpot.loc[arm].over) == (4, 4)
        assert (
            tpot.loc[arm].note == "1 invalid repeat left out, their failed requests still counted"
        )
    assert "no (1 invalid repeat left out, their failed requests still counted)" in text
    # The plan reads this job as history: one start, its 2 valid pairs of repeats (the burst
    # pair left out) give the within-start spread (1 df); the start spread is the model's.
    cfg = loader.load(ROOT / "config" / "local.yaml")
    cfg["serve"].update(grid=[{"isl": 8, "osl": 4}], concurrency=[1])
    cell = loader.Cell("host-cpu", "timed", 1, 1)
    (point,) = detect_plan.plan_cell(cfg, cell, res, tmp_path / "no-archive")["points"]
    assert point["point"] == "8-4 c1"
    assert (
        "repeat" in point["noise"]
        and "per arm measured (1 df of the pairs' ratio)" in point["noise"].split("repeat")[1]
    )
    assert "plan.noise_start_pct" in point["noise"]


def test_failed_share_is_an_invalid_repeat_not_a_failed_job(tmp_path, capsys):
    # --fail-share 0.5 fails every odd request: one of the 2 measured requests of every
    # repeat (3, then 7, then 9); with none allowed every repeat is invalid.
    rc, res = _run(tmp_path, ["--fail-share", "0.5"], max_failed_share=0.0)
    assert rc == 1
    err = capsys.readouterr().err
    assert "too few valid repeats to answer" in err and "1 of 2 requests failed" in err, err
    assert err.count("invalid repeat:") == 6  # every repeat measured before the job ended
    assert not (res / CELL / "serve" / "tuned" / "bench.json").exists()
    # The same faults with half the requests allowed to fail: all valid, the job passes.
    rc, res = _run(tmp_path / "again", ["--fail-share", "0.5"], max_failed_share=0.5)
    assert rc == 0
    marked = [p["invalid"] for arm in ARMS for p in _points(res, arm) if "invalid" in p]
    assert marked == [], marked


def test_a_floor_catches_a_burst_sent_as_separate_events(tmp_path, capsys):
    # Repeat 2 (requests 8-10) sent as 4 events back to back: each has a gap, so only the
    # plausible floor on TPOT can tell it was buffered. A floor of 1 ms: the real streams are
    # 5 ms per token, the burst's writes well under a millisecond apart.
    flags = ["--burst-requests", "8-11", "--burst-style", "events"]
    rc, res = _run(tmp_path, flags, min_plausible_tpot_ms=1.0)
    assert rc == 0
    for arm in ARMS:
        points = _points(res, arm)
        assert [("invalid" in p) for p in points] == [False, False, True]
        assert (
            "below the plausible floor 1 ms (serve.min_plausible_tpot_ms)" in points[2]["invalid"]
        )
    # With the floor off the same repeat counts.
    rc, res = _run(
        tmp_path / "off",
        ["--burst-requests", "8-11", "--burst-style", "events"],
        min_plausible_tpot_ms=None,
        min_plausible_itl_ms=None,
    )
    assert rc == 0
    marked = [p["invalid"] for arm in ARMS for p in _points(res, arm) if "invalid" in p]
    assert marked == [], marked
