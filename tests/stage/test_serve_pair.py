"""Both arms in one serve job (``--arm pair``), with real timed servers as the arms' servers.
Stand-in, why: vLLM cannot run on a CPU-only CI machine; the timed server is a real HTTP server
whose latencies and faults the test sets, so the interleaving and failures can be checked exactly.

The order of every measured point is read back from the job-wide ``seq`` numbers in the two
bench.json files; failures are caused for real by a server that exits mid-run.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from cellbench.assets import build as assets
from cellbench.config import loader as cbconfig
from cellbench.report import comparison_tables
from cellbench.serve import stage as serve_stage
from cellbench.serve.measure import POINT_PROGRESS
from support.stage_jobs import serve_argv

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
ARMS = ("untuned", "tuned")


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _server_port(log: Path) -> int:
    return int(log.read_text().split("starting on 127.0.0.1:")[1].split()[0])


GRID = [{"isl": 8, "osl": 4}]


def _pair_job(tmp_path: Path, server_flags: list[str], **fields) -> tuple[dict, dict]:
    """A pair job on two timed servers (its tracked fields) and this host's part, as the
    serve_pair rule passes them; ``fields`` set or override the job's."""
    tuned = tmp_path / "tune" / "configs"
    tuned.mkdir(parents=True, exist_ok=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    job = {
        "runtime": "local",
        "cell_id": "host-cpu/timed/tp1-ep1",
        "arm": "pair",
        "model": "timed-model",
        "server_command": TIMED + server_flags,
        "grid": GRID,
        "concurrency": [1],
        "prompts_per_concurrency": 2,
        "warmups_per_concurrency": 1,
        "gsm8k": False,
        **fields,
    }
    host = {
        "tuned_config_dir": str(tuned),
        "lease_dir": str(tmp_path / "leases"),
        "cache_dir": str(tmp_path / "cache"),
    }
    return job, host


def _pair_args(tmp_path: Path, server_flags: list[str], **fields) -> list[str]:
    job, host = _pair_job(tmp_path, server_flags, **fields)
    return serve_argv(job, host, tmp_path / "serve")


def test_pair_alternates_the_arms_repeat_by_repeat(tmp_path, capsys):
    args = _pair_args(
        tmp_path,
        ["--ttft-ms", "2", "--itl-ms", "1"],
        grid=[{"isl": 8, "osl": 4}, {"isl": 16, "osl": 3}],
        repeats=3,
    )
    assert serve_stage.main(args) == 0
    err = capsys.readouterr().err
    out = tmp_path / "serve"
    benches = {arm: json.loads((out / arm / "bench.json").read_text()) for arm in ARMS}
    # Progress: one stderr line per finished point (the rule's log gets stderr), naming the
    # point and carrying its headline numbers as recorded.
    progress = [ln for ln in err.splitlines() if POINT_PROGRESS in ln]
    assert len(progress) == sum(len(b["points"]) for b in benches.values())
    for arm, bench in benches.items():
        for p in bench["points"]:
            (line,) = [ln for ln in progress if f"#{p['seq']} {arm} " in ln]
            assert f"isl={p['isl']} osl={p['osl']}" in line and f"repeat {p['repeat']}" in line
            assert f"TTFT {p['mean_ttft_ms']:.1f} ms" in line
            assert f"output {p['output_throughput']:.1f} tok/s" in line
        # The environment a person needs to start the same server: only the tuned arm's
        # server was pointed at the tuned folder.
        has_folder = "VLLM_TUNED_CONFIG_FOLDER" in bench["server"]["env"]
        assert has_folder == (arm == "tuned")
    expected_order = [["untuned", "tuned"], ["tuned", "untuned"], ["untuned", "tuned"]]
    for arm, bench in benches.items():
        jsonschema.validate(bench, SCHEMA)
        assert bench["arm"] == arm and bench["interleaved"] is True
        assert bench["arm_order"] == expected_order
        assert len(bench["points"]) == 3 * 2
        assert all(p["failed"] == 0 for p in bench["points"])
        assert (out / arm / "lm_eval").is_dir()  # declared output, empty with --no-gsm8k
    assert benches["tuned"]["tuned_config_dir"] and benches["untuned"]["tuned_config_dir"] is None
    # The two arms ran on two servers of their own, both stopped now.
    ports = {arm: _server_port(out / arm / "server.log") for arm in ARMS}
    assert ports["untuned"] != ports["tuned"]
    assert all(_port_closed(p) for p in ports.values())
    # Audit of the interleaving from the recorded sequence alone.
    merged = sorted(
        ((p["seq"], arm, p) for arm, b in benches.items() for p in b["points"]),
        key=lambda t: t[0],
    )
    assert [s for s, _, _ in merged] == list(range(12))
    assert [arm[0] for _, arm, _ in merged] == list("uuttttuuuutt")
    assert [p["repeat"] for _, _, p in merged] == [r for r in range(3) for _ in range(4)]
    starts = [p["started_at"] for _, _, p in merged]
    assert starts == sorted(starts)
    # Same prompts for both arms within a repeat, fresh ones in the next repeat.
    for arm in ARMS:
        assert [p["seed"] for p in benches[arm]["points"]] == [0, 0, 1, 1, 2, 2]


def _results_of(out: Path) -> dict[str, bytes]:
    """Every file of both arms' results (not the servers' logs, which each run starts anew)."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "server.log"
    }


def test_a_failed_rerun_keeps_the_previous_results_whole(tmp_path, capsys):
    """The job runs again over the results of an earlier run and fails half-way: each arm's
    bench.json, per-request file and lm_eval/ (and their checksums) are the earlier ones, byte
    for byte, and still load; a run that succeeds then replaces them whole."""
    from cellbench.common import atomicio
    from cellbench.results import loaders

    # (the digest the rule would pass: the loaders refuse numbers of no known environment)
    digest = "local:timed"
    good = _pair_args(tmp_path, ["--ttft-ms", "1", "--itl-ms", "1"], repeats=2, image_digest=digest)
    assert serve_stage.main(good) == 0
    out = tmp_path / "serve"
    before = _results_of(out)
    assert {"untuned/lm_eval.sha256", "tuned/bench.json.sha256"} <= set(before)
    failing = _pair_args(
        tmp_path,
        ["--ttft-ms", "1", "--itl-ms", "1", "--exit-after", "5"],
        repeats=2,
        max_failed_share=1.0,
        image_digest=digest,
    )
    assert serve_stage.main(failing) == 1
    assert "server exited mid-run" in capsys.readouterr().err
    assert _results_of(out) == before
    for arm in ARMS:
        loaders.load_bench(out / arm / "bench.json")
        loaders.load_requests(out / arm / "requests.jsonl.gz")
        assert atomicio.tree_problem(out / arm / "lm_eval") is None
    assert serve_stage.main(good) == 0
    after = _results_of(out)
    assert after.keys() == before.keys() and after != before
    for arm in ARMS:
        loaders.load_bench(out / arm / "bench.json")


def test_either_server_dying_fails_the_pair_and_stops_both(tmp_path, capsys):
    # Per arm: 2 start-up completions (readiness, ignore_eos probe), then 1 warm-up + 2 measured
    # requests per repeat. After repeat 0 both servers have answered 5; the tuned arm goes first
    # in repeat 1, so its server is the one that reaches request 5 and exits.
    args = _pair_args(
        tmp_path,
        ["--ttft-ms", "1", "--itl-ms", "1", "--exit-after", "5"],
        repeats=2,
        max_failed_share=1.0,
    )
    assert serve_stage.main(args) == 1
    err = capsys.readouterr().err
    assert "pair failed: tuned server exited mid-run at tuned" in err, err
    assert "exiting on purpose" in err
    out = tmp_path / "serve"
    assert "exiting on purpose" in (out / "tuned" / "server.log").read_text()
    assert "exiting on purpose" not in (out / "untuned" / "server.log").read_text()
    for arm in ARMS:
        assert not (out / arm / "bench.json").exists()
        assert not (out / arm / "lm_eval").exists()
        assert _port_closed(_server_port(out / arm / "server.log"))


def test_too_many_failures_leave_no_valid_repeat_and_fail_the_pair(tmp_path, capsys):
    # One repeat per arm, each past the failed share: recorded invalid as measured, and with
    # no valid repeat left on either side the job fails after the grid, naming both.
    args = _pair_args(
        tmp_path,
        ["--fail-share", "0.5"],
        max_failed_share=0.05,
    )
    assert serve_stage.main(args) == 1
    err = capsys.readouterr().err
    assert "pair failed: too few valid repeats to answer" in err, err
    for arm in ARMS:
        assert f"{arm} 8-4 c1: 0 valid of 1 repeats" in err and "HTTP 500" in err, err
    for arm in ARMS:
        assert not (tmp_path / "serve" / arm / "bench.json").exists()
        assert _port_closed(_server_port(tmp_path / "serve" / arm / "server.log"))


def test_bad_pair_input_rejected_before_any_server(tmp_path, capsys):
    job, host = _pair_job(tmp_path, [])
    del host["tuned_config_dir"]
    assert serve_stage.main(serve_argv(job, host, tmp_path / "serve")) == 2
    assert "--arm pair needs --tuned-config-dir" in capsys.readouterr().err
    args = _pair_args(tmp_path, [], runtime="docker", image_ref="r:t", gpus=2, total_gpus=3)
    assert serve_stage.main(args) == 2
    assert "pinned digest" in capsys.readouterr().err  # a tag alone is never served
    # GPUs for two servers are the config's to check (test_config_checks_gpus_for_two_servers).
    assert not (tmp_path / "serve").exists()


@pytest.mark.parametrize("interleave", [True, False])
def test_config_checks_gpus_for_two_servers(interleave):
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["cells"][0]["tp"] = 8  # all 8 GPUs for one server
    config["serve"]["interleave_arms"] = interleave
    if interleave:
        with pytest.raises(cbconfig.ConfigError, match=r"2 x tp = 16 GPUs, but gpus = 8"):
            cbconfig.validate(config)
    else:
        assert cbconfig.validate(config)["serve"]["interleave_arms"] is False


def test_sigterm_stops_both_servers(tmp_path):
    # Snakemake cancels a job with SIGTERM: both arms' servers must go, and no result stays.
    import signal
    import subprocess
    import time

    args = _pair_args(
        tmp_path,
        ["--ttft-ms", "2000"],
        prompts_per_concurrency=50,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellbench.serve", *args], stderr=subprocess.PIPE, text=True
    )
    logs = [tmp_path / "serve" / arm / "server.log" for arm in ARMS]
    deadline = time.monotonic() + 60
    # Both servers launched (the tuned one after the untuned one is ready), then a moment more.
    while not all(log.exists() and "starting on" in log.read_text() for log in logs):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; servers stopped" in err
    for log in logs:
        assert _port_closed(_server_port(log))
    for arm in ARMS:
        assert not (tmp_path / "serve" / arm / "bench.json").exists()


def test_pair_rounds_start_fresh_servers_in_alternating_order(tmp_path, capsys):
    """Server starts as the unit of replication: each round stops both arms' servers and
    starts them afresh, untuned first in round 0, tuned first in round 1; every point
    records its round as ``start``, repeats are numbered job-wide, and the seeds (prompts)
    are fresh per repeat, the same for both arms."""
    args = _pair_args(
        tmp_path, ["--ttft-ms", "2", "--itl-ms", "1"], repeats=2, starts_min=2, starts_cap=2
    )
    assert serve_stage.main(args) == 0
    err = capsys.readouterr().err
    out = tmp_path / "serve"
    benches = {arm: json.loads((out / arm / "bench.json").read_text()) for arm in ARMS}
    for arm, bench in benches.items():
        jsonschema.validate(bench, SCHEMA)
        assert [(p["start"], p["repeat"]) for p in bench["points"]] == [
            (0, 0), (0, 1), (1, 2), (1, 3)
        ]  # fmt: skip
        assert [p["seed"] for p in bench["points"]] == [0, 1, 2, 3]
        assert len(bench["server"]["starts_ready_s"]) == 2
        # each start wrote its own banner into the arm's log: two servers, one after the other
        assert (out / arm / "server.log").read_text().count("starting on") == 2
        assert _port_closed(_server_port(out / arm / "server.log"))
    restarts = [ln for ln in err.splitlines() if "server started for round 1" in ln]
    assert [ln.split("] ")[1].split()[0] for ln in restarts] == ["tuned", "untuned"]
    assert "round 0: servers started untuned tuned" in err
    assert "round 1: servers started tuned untuned" in err
    # within each round the repeats alternate the arms (A B, B A)
    merged = sorted(
        ((p["seq"], arm) for arm, b in benches.items() for p in b["points"]), key=lambda t: t[0]
    )
    assert [arm[0] for _, arm in merged] == list("uttuuttu")


def test_pair_starts_stop_per_point_once_settled(tmp_path, capsys):
    """Sequential starts against two real timed servers: after the minimum (2 rounds) a
    point gets another round only while the group-sequential rule leaves it open, up to the
    cap. Whatever the timings on this machine, each point records the starts it was measured
    in and why it stopped, and that is what the rule says on the recorded starts with the
    report's design; the report's table shows it."""
    from cellbench.contracts.point import point_key
    from cellbench.report import frames
    from cellbench.results import loaders
    from cellbench.serve.repeat_stop import valid_groups
    from cellbench.stats import comparison, sequential

    cap = 4
    args = _pair_args(
        tmp_path,
        ["--ttft-ms", "20", "--itl-ms", "5"],
        grid=[{"isl": 8, "osl": 4}, {"isl": 16, "osl": 3}],
        repeats=1,
        starts_min=2,
        starts_cap=cap,
        min_change_pct=10,
        image_digest="local:timed",  # the loader wants one
    )
    assert serve_stage.main(args) == 0
    err = capsys.readouterr().err
    out = tmp_path / "serve"
    benches = {arm: json.loads((out / arm / "bench.json").read_text()) for arm in ARMS}
    a, b = benches["untuned"]["points"], benches["tuned"]["points"]
    design = sequential.Design(
        rows=2 * len(comparison.METRICS), cap=cap, min_starts=2, margin_pct=10.0
    )
    used = {}
    for key in {point_key(p) for p in a}:
        mine = [p for p in a if point_key(p) == key]
        theirs = [p for p in b if point_key(p) == key]
        n = mine[0]["starts_used"]
        used[key] = n
        assert 2 <= n <= cap
        # Measured in starts 0..n-1 on both sides, every record of the point agreeing.
        for side in (mine, theirs):
            assert sorted(p["start"] for p in side) == list(range(n))
            assert {(p["starts_used"], p["stop_reason"], p["starts_cap"]) for p in side} == {
                (n, mine[0]["stop_reason"], cap)
            }
        # The rule on the starts it had: no more after it said stop, none short of it.
        groups, invalid = valid_groups(mine, theirs, 0.05)
        step = sequential.decide(groups, comparison.METRICS, design, invalid=invalid)
        assert step["action"] == "stop" and mine[0]["stop_reason"] == step["reason"]
        assert mine[0]["stop_statuses"] == {m: s["status"] for m, s in step["metrics"].items()}
        if n > 2:
            shorter = {m: (x[: n - 1], y[: n - 1]) for m, (x, y) in groups.items()}
            assert sequential.decide(shorter, comparison.METRICS, design)["action"] == "continue"
        # The job's log says the same reason as the records.
        isl, osl, label = key
        said = f"{isl}-{osl} {label}: {mine[0]['stop_reason']} after {n} starts"
        assert said in err, (said, err[-2000:])
    # The job ran as many rounds as its longest point.
    assert max(p["start"] for p in a) + 1 == max(used.values())
    # Read back through the checked loader, the report's table shows starts used and why.
    loaded = [loaders.load_bench(out / arm / "bench.json") for arm in ARMS]
    serve, _, _ = frames.cell_frames(loaded)
    lines = comparison_tables.render(
        "t", serve[serve.arm == "untuned"], serve[serve.arm == "tuned"], min_change_pct=10.0
    )
    text = "\n".join(lines)
    assert "| stopped" in text and "| could see" in text
    for (isl, osl, _), n in used.items():
        row = next(ln for ln in lines if ln.startswith(f"| {isl}-{osl} "))
        assert f"; {n} of {cap} starts: " in row


def test_pair_starts_stop_early_on_a_clear_change(tmp_path):
    """A change far past the margin, measured for real: the tuned arm's timed server (the
    one given VLLM_TUNED_CONFIG_FOLDER) sends its tokens twice as far apart. The rule calls
    TPOT changed (worse) before the cap, the point records it, and the report's verdict,
    interval and p agree."""
    from cellbench.report import frames
    from cellbench.results import loaders
    from cellbench.stats import comparison, sequential

    script = (
        f"exec {sys.executable} -m cellbench.serve.timed_server --port {{port}} --ttft-ms 2 "
        '--itl-ms $(if [ -n "$VLLM_TUNED_CONFIG_FOLDER" ]; then echo 40; else echo 20; fi)'
    )
    job, host = _pair_job(
        tmp_path,
        [],
        grid=[{"isl": 8, "osl": 12}],
        repeats=1,
        starts_min=2,
        starts_cap=6,
        min_change_pct=10,
        image_digest="local:timed",
    )
    job["server_command"] = ["sh", "-c", script]
    args = serve_argv(job, host, tmp_path / "serve")
    assert serve_stage.main(args) == 0
    out = tmp_path / "serve"
    points = json.loads((out / "tuned" / "bench.json").read_text())["points"]
    assert points[0]["stop_statuses"]["mean_tpot_ms"] == sequential.CHANGED
    assert 2 <= points[0]["starts_used"] == len(points) <= 6
    loaded = [loaders.load_bench(out / arm / "bench.json") for arm in ARMS]
    serve, _, _ = frames.cell_frames(loaded)
    rows = comparison.compare_serve(
        serve[serve.arm == "untuned"], serve[serve.arm == "tuned"], min_change_pct=10.0
    )
    (tpot,) = [r for r in rows if r["metric"] == "mean_tpot_ms"]
    assert tpot["stop_status"] == sequential.CHANGED and tpot["verdict"] == "worse"
    assert tpot["ci_low"] > 10 and tpot["p_adj"] < 0.05 and tpot["change_pct"] > 50
    assert tpot["starts_used"] == len(points) and tpot["stop_reason"] in ("settled", "cap reached")


@pytest.mark.slow
def test_pair_runs_gsm8k_on_both_arms_at_once(tmp_path, capsys):
    # After the grid, lm-eval (real, as a subprocess) runs on both arms' servers together:
    # both start before either finishes, each writes its own arm's results.
    task = assets.make_gsm8k_set(tmp_path / "gsm8k", 4, seed=0, n_train=2)
    args = _pair_args(
        tmp_path,
        ["--ttft-ms", "1", "--itl-ms", "1"],
        gsm8k=True,
        gsm8k_dataset=str(task / assets.GSM8K_TEST_FILE),
        gsm8k_fewshot=1,
        gsm8k_limit=2,
        gsm8k_max_gen_toks=8,
    )
    assert serve_stage.main(args) == 0
    lines = capsys.readouterr().err.splitlines()
    started = [i for i, ln in enumerate(lines) if "running lm-eval GSM8K instance 1" in ln]
    finished = [i for i, ln in enumerate(lines) if "server finished in" in ln]
    assert len(started) == len(finished) == 2
    assert max(started) < min(finished)
    out = tmp_path / "serve"
    for arm in ARMS:
        assert f"on the {arm} server finished in" in "\n".join(lines)
        assert list((out / arm / "lm_eval").rglob("results*.json")), arm
