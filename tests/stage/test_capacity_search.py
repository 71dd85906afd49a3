"""The capacity search (serve.sla) in a real pair job, on real timed servers whose first-token
time grows by a set amount per other request in flight. Stand-in, why: vLLM cannot run on a
CPU-only CI machine, and a server whose latency against load is known makes the boundary
computable: p90 TTFT is about 20 + 20 x (c - 1) ms at concurrency c, so a bound of 190 ms
passes c = 9 (180 ms) and fails c = 10 (200 ms).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
from cellbench.contracts import capacity as rules
from cellbench.results import loaders
from cellbench.serve import stage as serve_stage
from support.stage_jobs import serve_argv

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
ARMS = ("untuned", "tuned")
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]

SLA = {
    "percentile": 90,
    "confidence": 90,
    "ttft_ms": 190,
    "start": 1,
    "max_concurrency": 64,
    "max_probes": 12,
    "points": [],
}
SERVER = ["--ttft-ms", "20", "--itl-ms", "1", "--ttft-ms-per-active", "20"]


def _pair_args(tmp_path: Path, grid: list[dict], **fields) -> list[str]:
    """A pair job on two timed servers, as the serve_pair rule passes it."""
    tuned = tmp_path / "tune" / "configs"
    tuned.mkdir(parents=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    job = {
        "runtime": "local",
        "cell_id": "host-cpu/timed/tp1-ep1",
        "arm": "pair",
        "model": "timed-model",
        "server_command": TIMED + SERVER,
        "grid": grid,
        "concurrency": [1],
        "prompts_per_concurrency": 2,
        "warmups_per_concurrency": 1,
        "gsm8k": False,
        "image_digest": "local-standin",
        **fields,
    }
    host = {
        "tuned_config_dir": str(tuned),
        "lease_dir": str(tmp_path / "leases"),
        "cache_dir": str(tmp_path / "cache"),
    }
    return serve_argv(job, host, tmp_path / "serve")


def test_search_crosses_the_boundary_and_records_every_probe(tmp_path, capsys):
    args = _pair_args(tmp_path, [{"isl": 8, "osl": 2}], sla=SLA)
    assert serve_stage.main(args) == 0
    err = capsys.readouterr().err
    out = tmp_path / "serve"
    benches = {arm: json.loads((out / arm / "bench.json").read_text()) for arm in ARMS}
    needed = 22  # MLPerf's early-stopping count for p90 at 90% confidence, none over
    steps = {}
    for arm, bench in benches.items():
        jsonschema.validate(bench, SCHEMA)
        loaders.load_bench(out / arm / "bench.json")  # the loader's own checks pass
        (entry,) = bench["capacity"]["points"]
        probes = entry["probes"]
        # grow x2 until a fail (16), then bisect 8..16: 12, 10, 9
        assert [p["concurrency"] for p in probes] == [1, 2, 4, 8, 16, 12, 10, 9]
        assert [p["passed"] for p in probes] == [True] * 4 + [False] * 3 + [True]
        assert (entry["capacity"], entry["first_fail"], entry["status"]) == (9, 10, "found")
        for p in probes:
            assert p["num_prompts"] == max(needed, p["concurrency"]) == p["completed"]
            assert p["passed"] == (p["values_ms"]["ttft"] <= 190)
            assert p["over"] == ([] if p["passed"] else ["ttft"])
        assert 170 < probes[-1]["values_ms"]["ttft"] <= 190 < probes[-2]["values_ms"]["ttft"]
        steps[arm] = [p["step"] for p in probes]
        assert f"capacity 8-2 {arm}: sustains 9 concurrent requests at p90 TTFT <= 190 ms" in err
    # each step ran on both arms, at the same load, alternating which went first
    assert steps["untuned"] == steps["tuned"] == list(range(8))
    first = [
        min(ARMS, key=lambda a: benches[a]["capacity"]["points"][0]["probes"][s]["started_at"])
        for s in range(8)
    ]
    assert first == ["untuned", "tuned"] * 4
    # the same server on both arms: one boundary each, no spread measured; the difference
    # (none) is below the search's resolution of one request in nine
    untuned, tuned = (benches[a]["capacity"]["points"][0] for a in ARMS)
    row = rules.compare(untuned, tuned, margin_pct=2.0)
    assert row["verdict"] == "inconclusive" and row["change_pct"] == 0.0
    assert rules.verdict_text(row) == "inconclusive (could have seen changes of at least 11.1%)"
