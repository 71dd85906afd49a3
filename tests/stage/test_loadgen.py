"""Load generator against the timed server (a real HTTP server in a subprocess).

Truth for the accuracy test is what the server actually did, read back from its /stats: the
time it wrote each request's first and last token. Server and client share the host's monotonic
clock (``time.perf_counter``), so TTFT truth is (server's first write - client's request start)
and TPOT truth is (last write - first write) / (tokens - 1). The client's error is therefore only
how late it notices chunks, which is what this load generator must keep small.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import requests
from cellbench.serve import loadgen, random_prompts, sse_client
from cellbench.serve.timed_server import launch

TTFT_MS, ITL_MS, OSL = 200.0, 50.0, 16
BENCH_SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "bench.schema.json"


def _truth(base: str, results: list[sse_client.RequestResult]) -> tuple[float, float]:
    stats = requests.get(f"{base}/stats", timeout=10).json()["requests"]
    ttft, tpot = [], []
    for r in results:
        s = stats[r.response_id]
        ttft.append((s["first"] - r.start) * 1000.0)
        tpot.append((s["last"] - s["first"]) / (s["n"] - 1) * 1000.0)
    return float(np.mean(ttft)), float(np.mean(tpot))


@pytest.fixture(scope="module")
def timed():
    with launch("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)) as (base, _):
        yield base


def _errors(base: str, conc: int, prompts: int) -> tuple[dict, float, list[str]]:
    """Run one point; return it, its true TPOT and every metric whose client error is over
    tolerance."""
    tok = random_prompts.ServerTokenizer(base, "timed-model")
    spec = loadgen.PointSpec(
        isl=16, osl=OSL, max_concurrency=conc, num_prompts=prompts, num_warmups=conc
    )
    pt = loadgen.run_point(base, "timed-model", tok, spec, ignore_eos=True, keep_results=True)
    assert pt["completed"] == prompts and pt["failed"] == 0
    true_ttft, true_tpot = _truth(base, pt["_results"])
    off = []
    for name, got, want in (
        ("ttft", pt["mean_ttft_ms"], true_ttft),
        ("tpot", pt["mean_tpot_ms"], true_tpot),
    ):
        if abs(got - want) > max(0.02 * want, 0.5):
            off.append(f"c={conc} {name}: measured {got:.3f} truth {want:.3f}")
    return pt, true_tpot, off


@pytest.mark.slow
@pytest.mark.parametrize("conc,prompts", [(1, 4), (32, 64), (256, 512)])
def test_ttft_tpot_match_truth(timed, conc, prompts):
    pt, true_tpot, off = _errors(timed, conc, prompts)
    if off:
        # One more try, and only one: in CI this 2-core machine also runs dockerd, the registry
        # and slurmd, and one stall of the client during the c=256 first-token burst once put
        # every request ~37 ms late (246.8 ms against 209.7). A client that is late by design
        # fails both tries; both tries' errors are in the message.
        pt, true_tpot, again = _errors(timed, conc, prompts)
        assert not again, f"both tries over tolerance: {off} then {again}"
    # Every request produced exactly OSL tokens (ignore_eos honoured), read from usage.
    assert pt["total_output_tokens"] == prompts * OSL
    assert pt["total_input_tokens"] == pt["total_input_tokens_requested"] == prompts * 16
    # The server's own timing stays near its configuration, so the truth above is meaningful.
    assert true_tpot == pytest.approx(ITL_MS, rel=0.2)


def test_keys_and_warmups_excluded(timed):
    tok = random_prompts.ServerTokenizer(timed, "timed-model")
    before = requests.get(f"{timed}/stats", timeout=10).json()["n_completions"]
    spec = loadgen.PointSpec(isl=8, osl=3, max_concurrency=2, num_prompts=6, num_warmups=4)
    pt = loadgen.run_point(timed, "timed-model", tok, spec, ignore_eos=True, keep_results=True)
    after = requests.get(f"{timed}/stats", timeout=10).json()["n_completions"]
    assert after - before == 10  # 4 warm-ups + 6 measured reached the server ...
    assert pt["completed"] + pt["failed"] == 6  # ... but only the 6 are in the result
    assert len(pt.pop("_results")) == 6
    for key in loadgen.POINT_KEYS + (
        "date",
        "backend",
        "model_id",
        "num_prompts",
        "request_rate",
        "max_concurrency",
    ):
        assert key in pt, key
    assert pt["request_rate"] == "inf" and pt["max_concurrency"] == 2
    json.dumps(pt)  # serialisable as is
    # ITL is chunk gaps: OSL-1 per request.
    assert pt["mean_itl_ms"] > 0 and pt["client_cpu_ms_per_request"] > 0


def test_prompts_have_exact_length(timed):
    tok = random_prompts.ServerTokenizer(timed, "timed-model")
    for p in random_prompts.make_prompts(tok, 5, 37, seed=3):
        assert len(tok.encode(p.text)) == 37 == p.prompt_len
    a = random_prompts.make_prompts(tok, 3, 10, seed=1)
    b = random_prompts.make_prompts(tok, 3, 10, seed=1)
    assert [p.text for p in a] == [p.text for p in b]


def test_failed_requests_counted_and_threshold():
    with launch("--ttft-ms", "5", "--itl-ms", "1", "--fail-share", "0.25") as (base, _):
        tok = random_prompts.ServerTokenizer(base, "timed-model")
        spec = loadgen.PointSpec(isl=4, osl=4, max_concurrency=4, num_prompts=40, num_warmups=0)
        pt = loadgen.run_point(base, "timed-model", tok, spec, ignore_eos=True)
        server_failed = requests.get(f"{base}/stats", timeout=10).json()["n_failed"]
    assert pt["failed"] == server_failed == 10
    assert pt["completed"] == 30
    assert pt["total_output_tokens"] == 30 * 4  # failures contribute nothing
    assert any("HTTP 500" in e for e in pt["errors"])
    loadgen.check_failures(pt, 0.25)  # exactly at the threshold passes
    with pytest.raises(loadgen.TooManyFailures, match="10 of 40 requests failed"):
        loadgen.check_failures(pt, 0.2)


def test_stream_without_done_and_no_ignore_eos():
    # transformers-serve style: usage on the last token chunk, no [DONE], 422 on ignore_eos,
    # and an EOS after 5 tokens: the real output length is recorded, not max_tokens.
    args = ("--style", "transformers", "--reject-ignore-eos", "--eos-after", "5")
    with launch("--ttft-ms", "20", "--itl-ms", "5", *args) as (base, _):
        assert loadgen.probe_ignore_eos(base, "timed-model") is False
        tok = random_prompts.ServerTokenizer(base, "timed-model")
        spec = loadgen.PointSpec(isl=4, osl=12, max_concurrency=2, num_prompts=4, num_warmups=0)
        pt = loadgen.run_point(base, "timed-model", tok, spec, ignore_eos=False)
        bad = loadgen.run_point(base, "timed-model", tok, spec, ignore_eos=True)
    assert pt["failed"] == 0 and pt["total_output_tokens"] == 4 * 5
    assert pt["mean_tpot_ms"] == pytest.approx(5.0, abs=2.0)
    assert bad["failed"] == 4 and "HTTP 422" in bad["errors"][0]


def test_server_gone_counts_failures():
    with launch("--ttft-ms", "5", "--itl-ms", "1", "--exit-after", "3") as (base, _):
        tok = random_prompts.ServerTokenizer(base, "timed-model")
        spec = loadgen.PointSpec(isl=4, osl=3, max_concurrency=1, num_prompts=6, num_warmups=0)
        pt = loadgen.run_point(base, "timed-model", tok, spec, ignore_eos=True)
    # Completion requests 0-2 are served; request 3 kills the server, the rest find it gone.
    assert pt["completed"] == 3
    assert pt["failed"] == 3


def test_compute_metrics_definitions():
    # Two hand-built results: the formulas of vllm bench serve, checked by hand.
    # The server counted one token more per prompt than was asked for (a BOS, say).
    ok = sse_client.RequestResult(
        success=True, prompt_len=10, ttft=0.1, itl=[0.02, 0.03], latency=0.15, output_tokens=3,
        prompt_tokens=11,
    )  # fmt: skip
    ok2 = sse_client.RequestResult(
        success=True, prompt_len=10, ttft=0.3, itl=[], latency=0.3, output_tokens=1,
        prompt_tokens=11,
    )  # fmt: skip
    bad = sse_client.RequestResult(success=False, prompt_len=10, error="x")
    m = loadgen.compute_metrics([ok, ok2, bad], duration=2.0)
    assert m["completed"] == 2 and m["failed"] == 1
    # vLLM's key counts what the server counted; the requested lengths sit beside it.
    assert m["total_input_tokens"] == 22 and m["total_input_tokens_requested"] == 20
    assert m["total_output_tokens"] == 4
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(2.0)
    assert m["total_token_throughput"] == pytest.approx(13.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    # TPOT only from requests with more than one token: (0.15 - 0.1) / 2.
    assert m["mean_tpot_ms"] == pytest.approx(25.0)
    assert m["mean_itl_ms"] == pytest.approx(25.0)
    assert m["p99_e2el_ms"] == pytest.approx(np.percentile([150.0, 300.0], 99))


def test_bad_point_rejected_before_any_request():
    with pytest.raises(ValueError, match="max_concurrency"):
        loadgen.run_point(
            "http://127.0.0.1:9",
            "m",
            None,  # type: ignore[arg-type]
            loadgen.PointSpec(isl=4, osl=4, max_concurrency=0, num_prompts=1, num_warmups=0),
            ignore_eos=True,
        )


def test_poisson_offsets_are_seeded():
    rng = np.random.default_rng
    a = loadgen._request_times(2000, 50.0, rng(7))
    assert a == loadgen._request_times(2000, 50.0, rng(7))
    assert a != loadgen._request_times(2000, 50.0, rng(8))
    gaps = np.diff(a)
    assert a[0] == 0.0 and (gaps > 0).all()
    assert np.mean(gaps) == pytest.approx(1 / 50.0, rel=0.1)  # exponential with mean 1/rate
    assert loadgen._request_times(3, float("inf"), rng(0)) == [0.0, 0.0, 0.0]


def test_finite_request_rate_paces_requests(timed):
    tok = random_prompts.ServerTokenizer(timed, "timed-model")
    spec = loadgen.PointSpec(
        isl=4, osl=2, max_concurrency=64, num_prompts=30, num_warmups=0, request_rate=20.0
    )
    pt = loadgen.run_point(timed, "timed-model", tok, spec, ignore_eos=True, keep_results=True)
    starts = sorted(r.start for r in pt.pop("_results"))
    offsets = loadgen._request_times(30, 20.0, np.random.default_rng(0))
    # Requests leave on the seeded Poisson schedule, not all at once. Each request's
    # lateness is measured against the earliest one's, so a slow first connect on a
    # loaded machine shifts nothing; a burst would be ~0.7 s late at the median.
    lateness = np.array(starts) - np.array(offsets)
    lateness -= lateness.min()
    assert np.median(lateness) < 0.02, lateness
    assert lateness.max() < 0.25, lateness
    assert starts[-1] - starts[0] >= 0.9 * offsets[-1]
    assert pt["request_rate"] == 20.0 and pt["failed"] == 0


def test_idle_connection_closed_by_server_is_replaced():
    # The server drops idle keep-alive connections after 0.2 s (uvicorn does so after 5 s).
    import asyncio
    import time

    async def two_requests(base: str) -> list[sse_client.RequestResult]:
        client = sse_client.SSEClient(base)
        body = json.dumps({"model": "timed-model", "prompt": "w1", "max_tokens": 2, "stream": True})
        first = await client.request(body.encode(), 1)
        await asyncio.sleep(0.6)
        second = await client.request(body.encode(), 1)
        client.close()
        return [first, second]

    with launch("--ttft-ms", "5", "--itl-ms", "1", "--keepalive-timeout", "0.2") as (base, _):
        t0 = time.monotonic()
        first, second = asyncio.run(two_requests(base))
    assert first.success and second.success, (first.error, second.error)
    assert time.monotonic() - t0 < 5


class _ScriptedSSE(BaseHTTPRequestHandler):
    """Answers every completion with the server's `script`: (delay_s, events) pairs, each
    group of events sent as one chunk in one write after its delay."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for delay, events in self.server.script:  # type: ignore[attr-defined]
            time.sleep(delay)
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        done = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))  # last chunk, then end

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _scripted_server(script):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedSSE)
    srv.script = script  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _tok(i: int) -> dict:
    return {"id": "cmpl-1", "choices": [{"index": 0, "text": f" w{i}"}]}


def _usage(prompt_tokens: int | None, completion_tokens: int) -> dict:
    u = {"completion_tokens": completion_tokens}
    if prompt_tokens is not None:
        u["prompt_tokens"] = prompt_tokens
    return {"id": "cmpl-1", "choices": [], "usage": u}


def _requests(base: str, n: int, prompt_len: int) -> list[sse_client.RequestResult]:
    async def go() -> list[sse_client.RequestResult]:
        client = sse_client.SSEClient(base)
        body = json.dumps({"model": "m", "prompt": "w1", "max_tokens": 5, "stream": True})
        try:
            return [await client.request(body.encode(), prompt_len) for _ in range(n)]
        finally:
            client.close()

    return asyncio.run(go())


def test_events_of_one_write_are_stamped_one_by_one():
    # Three tokens flushed in one write (as transformers serve flushes what its queue holds),
    # then two tokens 60 ms apart: the burst's gaps are small but not 0, the spaced ones ~60 ms.
    gap = 0.06
    script = [
        (0.02, [_tok(0), _tok(1), _tok(2)]),
        (gap, [_tok(3)]),
        (gap, [_tok(4)]),
        (0.0, [_usage(6, 5)]),
    ]
    with _scripted_server(script) as base:
        (r,) = _requests(base, 1, 4)
    assert r.success, r.error
    assert len(r.itl) == 4
    burst, spaced = r.itl[:2], r.itl[2:]
    assert all(0 < x < 0.01 for x in burst), burst  # parse time apart, never exactly 0
    assert all(x >= gap * 0.8 for x in spaced), spaced
    m = loadgen.compute_metrics([r], duration=1.0)
    assert m["mean_tpot_ms"] > 0 and m["median_itl_ms"] > 0
    assert m["p99_itl_ms"] >= gap * 0.8 * 1000

    # Everything in one write: TPOT is the parsing time per token, small but not 0.
    with _scripted_server([(0.0, [_tok(i) for i in range(5)] + [_usage(6, 5)])]) as base:
        (r,) = _requests(base, 1, 4)
    assert r.success and len(r.itl) == 4 and all(x > 0 for x in r.itl)
    assert loadgen.compute_metrics([r], duration=1.0)["mean_tpot_ms"] > 0


def test_input_tokens_from_usage_or_null_when_the_server_does_not_say():
    point_schema = json.loads(BENCH_SCHEMA.read_text())["properties"]["points"]["items"]
    with _scripted_server([(0.0, [_tok(0), _tok(1)]), (0.0, [_usage(6, 2)])]) as base:
        counted = _requests(base, 3, 4)
    m = loadgen.compute_metrics(counted, duration=2.0)
    assert m["total_input_tokens"] == 18 and m["total_input_tokens_requested"] == 12
    assert m["total_token_throughput"] == pytest.approx((18 + 6) / 2.0)

    # usage without prompt_tokens, then no usage chunk at all: null, with what was asked for
    for last in ([_usage(None, 2)], []):
        with _scripted_server([(0.0, [_tok(0), _tok(1), *last])]) as base:
            silent = _requests(base, 2, 4)
        m = loadgen.compute_metrics(silent, duration=2.0)
        assert m["completed"] == 2
        assert m["total_input_tokens"] is None and m["total_input_tokens_requested"] == 8
        assert m["total_token_throughput"] is None
        row = {"isl": 4, "osl": 2, "max_concurrency": 1, "repeat": 0, "seq": 0,
               "started_at": "2026-12-04T10:00:00.000+00:00", "num_prompts": 2,
               "request_rate": "inf", **m}  # fmt: skip
        jsonschema.validate(row, point_schema)

    # one completed request without prompt usage makes the total unknown, not a partial sum
    mixed = counted[:1] + silent[:1]
    assert loadgen.compute_metrics(mixed, duration=1.0)["total_input_tokens"] is None
