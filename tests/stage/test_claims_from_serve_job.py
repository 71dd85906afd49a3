"""Percentile claims read from real per-request files (issue 32 item 5): one serve job (both
arms) runs the project's load generator against the timed stand-in server, then the report
checks latency bounds from the sidecars that job wrote.

Stand-in, why: vLLM cannot run on a CPU-only machine; the timed server's first token comes
``--ttft-ms`` after a request and each further token ``--itl-ms`` later, so which side of a
bound every request falls is known, and a p99 claim can be told apart from its failure and
from too few queries. Every expected verdict here is computed in the test from the binomial
definition (plain math), not with the module under test.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
from cellbench.report import build as report
from cellbench.report import percentile_claims
from cellbench.serve import stage as serve_stage
from support import result_fixtures as fx

TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
CELL = "host-cpu/timed/tp1-ep1"
ARMS = ("untuned", "tuned")


def _tail_at_least(k: int, n: int, p: float = 0.01) -> float:
    """P(Binomial(n, p) >= k), by plain sums."""
    return 1 - sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k))


def _expected(queries: int, over: int) -> str:
    """p99 at 99% confidence by MLPerf's rule, from the definition."""
    if queries and _tail_at_least(over + 1, queries) >= 0.99:  # P(X <= over) <= 0.01
        return "yes"
    if over and _tail_at_least(over, queries) <= 0.01:
        return "no"
    return "cannot tell"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A results folder with one cell whose serve job ran for real: per arm, 8-3 at c16 (480
    requests) and c1 (30 requests), one repeat, first token at 3 ms, 2 ms per further token."""
    tmp = tmp_path_factory.mktemp("claims")
    res = tmp / "results"
    out = res / CELL / "serve"
    tuned = tmp / "tune" / "configs"
    tuned.mkdir(parents=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    args = [
        "--runtime", "local", "--cell-id", CELL, "--arm", "pair", "--model", "timed-model",
        "--server-command-json", json.dumps([*TIMED, "--ttft-ms", "3", "--itl-ms", "2"]),
        "--tuned-config-dir", str(tuned), "--lease-dir", str(tmp / "leases"),
        "--cache-dir", str(tmp / "cache"), "--grid-json", '[{"isl": 8, "osl": 3}]',
        "--concurrency", "16,1", "--prompts-per-concurrency", "30",
        "--warmups-per-concurrency", "1", "--repeats", "1", "--no-gsm8k", "--out-dir", str(out),
        "--image-digest", "local:test",
    ]  # fmt: skip
    assert serve_stage.main(args) == 0
    return res


def _inputs(res: Path) -> list[Path]:
    # bench.json as the serve job wrote it; tune and GSM8K results by hand (not under test)
    files = [fx.write_tune(res, CELL)]
    for arm in ARMS:
        files += [res / CELL / "serve" / arm / "bench.json"]
        files += [fx.write_gsm8k(res, CELL, arm, [True, False])]
    return files


def test_claims_from_a_real_serve_job(served, tmp_path):
    # TTFT bounded at 2 ms at c16: under the server's 3 ms, so every request there is over.
    c16 = {"isl": 8, "osl": 3, "concurrency": 16, "ttft_ms": 2}
    bounds = {"ttft_ms": 1000, "tpot_ms": 1000, "points": [c16]}
    files = _inputs(served)
    path = report.write_report(files, tmp_path / "report", results=served, latency_bounds=bounds)
    text = path.read_text()
    claims = percentile_claims.claims_frame(report.load_inputs(files, served), bounds)
    assert len(claims) == 8  # per arm: c16 and c1, TTFT and TPOT
    for arm in ARMS:
        bench = json.loads((served / CELL / "serve" / arm / "bench.json").read_text())
        by_load = {f"c{p['max_concurrency']}": p for p in bench["points"]}
        rows = claims[claims.arm == arm].set_index(["load", "metric"])
        for load, sent in (("c16", 480), ("c1", 30)):
            assert by_load[load]["num_prompts"] == sent and by_load[load]["failed"] == 0
            # one output token after the first every 2 ms: far within a second, none over
            tpot = rows.loc[(load, "TPOT")]
            assert (tpot.queries, tpot.over, tpot.bound_ms) == (sent, 0, 1000)
            assert tpot.verdict == _expected(sent, 0)
        assert rows.loc[("c16", "TPOT")].verdict == "yes"  # 480 >= 459 with none over
        assert rows.loc[("c1", "TPOT")].verdict == "cannot tell"
        assert rows.loc[("c1", "TPOT")].queries_needed == 459
        ttft16, ttft1 = rows.loc[("c16", "TTFT")], rows.loc[("c1", "TTFT")]
        assert (ttft16.bound_ms, ttft16.over, ttft16.verdict) == (2, 480, _expected(480, 480))
        assert ttft16.verdict == "no" and pd.isna(ttft16.queries_needed)
        assert ttft16.observed_ms >= 3.0  # no first token before the server sent it
        # the override named c16 only: c1 keeps the section's bound
        assert (ttft1.bound_ms, ttft1.over, ttft1.verdict) == (1000, 0, "cannot tell")
    section = text.split("#### Latency bounds: p99 at 99% confidence")[1].split("\n####")[0]
    assert "| 8-3 | c16 | Triton MoE Untuned | TTFT | 2 |" in section, section
    assert "| 480 | 480 | no | - |" in section and "| 480 | 0 | yes | 459 |" in section
    assert "| 30 | 0 | cannot tell | 459 |" in section
    csv = (tmp_path / "report" / percentile_claims.CSV_NAME).read_text().splitlines()
    assert csv[0].startswith("cell,arm,isl,osl,load,metric") and len(csv) == 9
    pr = (tmp_path / "report" / "pr" / "timed.md").read_text()
    assert "#### Latency bounds: p99 at 99% confidence" in pr
    # INDEX.json names the per-request files read, each vouched for by its recorded checksum
    index = json.loads((tmp_path / "report" / "INDEX.json").read_text())
    read = [i for i in index["inputs"] if i["kind"] == "requests"]
    assert sorted(Path(i["path"]).parent.name for i in read) == ["tuned", "untuned"]
    assert {i["checksum"] for i in read} == {"verified"}


def test_no_bounds_no_section_and_no_table(served, tmp_path):
    text = report.write_report(_inputs(served), tmp_path / "r", results=served).read_text()
    assert "Latency bounds" not in text
    assert not (tmp_path / "r" / percentile_claims.CSV_NAME).exists()


def test_published_percentiles_carry_their_counts(served, tmp_path):
    """serve.csv and tidy.csv of the same real job: every percentile with the requests behind
    it; p99 kept at c16 (480 requests, MLPerf's count 459 met), withheld at c1 (30), as is
    c1's p90 (its count is 44), each with the reason; bench.json keeps every figure."""
    report.write_report(_inputs(served), tmp_path / "r", results=served)
    serve = pd.read_csv(tmp_path / "r" / "serve.csv").set_index(["arm", "max_concurrency"])
    for arm in ARMS:
        bench = json.loads((served / CELL / "serve" / arm / "bench.json").read_text())
        by_conc = {p["max_concurrency"]: p for p in bench["points"]}
        for conc, sent in ((16, 480), (1, 30)):
            row, point = serve.loc[(arm, conc)], by_conc[conc]
            # osl 3: every request has a TPOT and two gaps
            for metric in ("ttft", "tpot", "itl", "e2el"):
                assert row[f"{metric}_requests"] == point[f"{metric}_requests"] == sent
            assert point["p99_tpot_ms"] > 0 and point["p90_tpot_ms"] > 0  # kept in bench.json
        c16, c1 = serve.loc[(arm, 16)], serve.loc[(arm, 1)]
        assert c16.p99_ttft_ms == by_conc[16]["p99_ttft_ms"] and c16.p90_itl_ms > 0
        assert pd.isna(c16.percentile_note)
        assert pd.isna(c1.p99_ttft_ms) and pd.isna(c1.p90_tpot_ms) and pd.isna(c1.p99_e2el_ms)
        assert c1.median_ttft_ms == by_conc[1]["median_ttft_ms"]  # medians are never withheld
        assert "p99 TTFT: 30 requests, fewer than the 459" in c1.percentile_note
        assert "p90 TPOT: 30 requests, fewer than the 44" in c1.percentile_note
    tidy = pd.read_csv(tmp_path / "r" / "tidy.csv")
    serve_rows = tidy[tidy.stage == "serve"]
    p99 = serve_rows[serve_rows.metric == "p99_tpot_ms"].set_index(["arm", "concurrency"])
    for arm in ARMS:
        assert p99.loc[(arm, 16)].requests == 480 and p99.loc[(arm, 16)].value > 0
        assert p99.loc[(arm, 1)].requests == 30 and pd.isna(p99.loc[(arm, 1)].value)
        assert "fewer than the 459 MLPerf's early-stopping rule needs" in p99.loc[(arm, 1)].note
    medians = serve_rows[serve_rows.metric.str.startswith(("median_", "p90_", "p99_"))]
    assert medians.requests.notna().all()  # every percentile row has its count
    assert serve_rows[serve_rows.metric == "mean_ttft_ms"].requests.isna().all()
