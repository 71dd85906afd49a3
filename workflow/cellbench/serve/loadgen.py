"""Streaming load generator for OpenAI-compatible ``/v1/completions`` servers (host side).

It reproduces what ``vllm bench serve`` measures, with the same definitions and saved keys:

* TTFT: first SSE chunk with non-empty ``choices`` minus the request's start;
* ITL: gaps between later chunks with non-empty ``choices`` (chunk level);
* E2EL: last such chunk minus start;
* TPOT: (E2EL - TTFT) / (output_tokens - 1), output tokens from ``usage.completion_tokens``
  (or, when a server sends no usage, the generated text re-tokenised);
* each chunk's time is taken when that SSE event is parsed, as ``vllm bench serve``'s client
  does per message: several events read from the socket at once (a server that flushes tokens
  in bursts, as ``transformers serve`` does) get distinct times, not one shared time that would
  make their ITL and TPOT exactly 0;
* ``total_input_tokens`` counts the server's ``usage.prompt_tokens``, as vLLM's client now
  does; the prompt lengths asked for are ``total_input_tokens_requested``. A server that
  reports no prompt usage leaves ``total_input_tokens`` (and ``total_token_throughput``,
  which adds it) null, never silently the requested figure;
* mean/median/std/p90/p99 with numpy over successful requests; failed requests are counted and
  left out of every statistic. Streams that end without ``data: [DONE]`` are fine;
* beside them, per metric, the requests behind its statistics (``ttft_requests``, ...:
  ``cellbench.stats.percentile_counts`` says which percentiles those counts let the report
  publish).

Prompts are random token sequences of exactly ``isl`` tokens under the model's tokenizer (a
local ``tokenizer.json``/``transformers`` tokenizer, or the server's ``/tokenize`` and
``/detokenize``), drawn from a fixed seed (as are Poisson arrival times when the request rate
is finite). Requests use temperature 0, ``max_tokens = osl`` and, when the server accepts it,
``ignore_eos``; real output lengths are recorded, never assumed.

Requests go through a small HTTP/1.1 client (``cellbench.serve.sse_client.SSEClient``: keep-alive
pool, plain ``http://`` only) that handles each SSE event inside ``data_received`` and
timestamps it there, so hundreds of concurrent streams add little lag to the recorded times; an
aiohttp client that wakes a coroutine per chunk measured TPOT 2.5-8% high at concurrency 256
on 2 CPUs, this one stays under 1% (``benchmarks/loadgen_accuracy.py``). The client's own CPU
time per request is recorded with each point so a result can show the client was not the
bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import requests

from cellbench.contracts import load_shapes, request_detail
from cellbench.serve.random_prompts import Prompt, Tokenizer, make_prompts
from cellbench.serve.sse_client import RequestResult, SSEClient

# Keys of one measured point, in the order vLLM saves them.
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
STAT_NAMES = ("mean", "median", "std", "p90", "p99")
POINT_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_input_tokens_requested",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
) + tuple(f"{s}_{m}_ms" for m in METRIC_NAMES for s in STAT_NAMES)


class TooManyFailures(RuntimeError):
    """A point's failed-request share exceeded the allowed threshold."""


def _request_times(
    n: int, rate: float, rng: np.random.Generator, burstiness: float = 1.0
) -> list[float]:
    """Send offsets in seconds: all zero for rate inf, else gamma gaps (load_shapes)."""
    return load_shapes.arrival_offsets(n, rate, burstiness, rng)


async def _run_batch(
    client: SSEClient,
    payloads: list[tuple[bytes, int]],
    max_concurrency: int,
    request_rate: float,
    seed: int,
    burstiness: float = 1.0,
) -> tuple[list[RequestResult], float]:
    sem = asyncio.Semaphore(max_concurrency)
    offsets = _request_times(len(payloads), request_rate, np.random.default_rng(seed), burstiness)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def limited(i: int) -> RequestResult:
        delay = t0 + offsets[i] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            return await client.request(payloads[i][0], payloads[i][1])

    start = time.perf_counter()
    results = await asyncio.gather(*(limited(i) for i in range(len(payloads))))
    return list(results), time.perf_counter() - start


async def _run_with_warmup(
    base_url: str,
    warmups: list[tuple[bytes, int]],
    payloads: list[tuple[bytes, int]],
    max_concurrency: int,
    request_rate: float,
    seed: int,
    burstiness: float = 1.0,
    probes: Sequence[Any] = (),
) -> tuple[list[RequestResult], float, float]:
    """Warm-ups then the measured batch on one session, so measured requests reuse open
    connections (a burst of TCP handshakes would otherwise land in the first TTFTs).
    ``probes`` (server metrics, GPU telemetry) begin right before the measured batch and end
    right after it, so they see the measured requests only, never the warm-ups."""
    client = SSEClient(base_url)
    try:
        if warmups:
            await _run_batch(client, warmups, max_concurrency, float("inf"), seed)
        for probe in probes:
            probe.begin()
        try:
            cpu0 = time.process_time()
            results, duration = await _run_batch(
                client, payloads, max_concurrency, request_rate, seed, burstiness
            )
            cpu = time.process_time() - cpu0
        finally:
            for probe in probes:
                probe.end()
    finally:
        client.close()
    return results, duration, cpu


def compute_metrics(
    results: list[RequestResult], duration: float, tok: Tokenizer | None = None
) -> dict[str, Any]:
    """Summarise one point the way ``vllm bench serve``'s ``calculate_metrics`` does."""
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    completed = total_in = total_out = 0
    served_in: int | None = 0  # None once a completed request came back without prompt usage
    for r in results:
        if not r.success:
            continue
        n_out = r.output_tokens
        if not n_out:
            n_out = len(tok.encode(r.generated_text)) if tok is not None else 0
        total_out += n_out
        total_in += r.prompt_len
        if served_in is not None and isinstance(r.prompt_tokens, int):
            served_in += r.prompt_tokens
        else:
            served_in = None
        if n_out > 1:
            tpots.append((r.latency - r.ttft) / (n_out - 1))
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.latency)
        completed += 1
    m: dict[str, Any] = {
        "duration": duration,
        "completed": completed,
        "failed": len(results) - completed,
        # vLLM's key, vLLM's meaning: what the server counted (null when it did not say).
        "total_input_tokens": served_in,
        "total_input_tokens_requested": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration if duration > 0 else 0.0,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": None
        if served_in is None
        else ((served_in + total_out) / duration if duration > 0 else 0.0),
    }
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        for stat, v in request_detail.stats_ms(vals).items():
            m[f"{stat}_{name}_ms"] = v
    # Requests behind each metric (ITL: those with a gap; a request's gaps are not queries).
    with_gaps = sum(1 for r in results if r.success and r.itl)
    for name, n in (("ttft", len(ttfts)), ("tpot", len(tpots)), ("itl", with_gaps)):
        m[f"{name}_requests"] = n
    m["e2el_requests"] = len(e2els)
    return m


@dataclass
class PointSpec:
    """One measured point of the grid."""

    isl: int
    osl: int
    max_concurrency: int
    num_prompts: int
    num_warmups: int
    request_rate: float = float("inf")
    seed: int = 0
    burstiness: float = 1.0  # gamma shape of the arrival gaps at a finite rate (1: Poisson)


def build_payloads(
    model_id: str,
    prompts: list[Prompt],
    osl: int,
    ignore_eos: bool,
) -> list[tuple[bytes, int]]:
    """Request bodies (serialised up front) for ``prompts``: streaming, temperature 0, usage
    requested."""
    out = []
    for p in prompts:
        body: dict[str, Any] = {
            "model": model_id,
            "prompt": p.text,
            "max_tokens": osl,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ignore_eos:
            body["ignore_eos"] = True
        out.append((json.dumps(body).encode(), p.prompt_len))
    return out


def run_point(
    base_url: str,
    model_id: str,
    tok: Tokenizer,
    spec: PointSpec,
    *,
    ignore_eos: bool,
    backend: str = "openai",
    keep_results: bool = False,
    probes: Sequence[Any] = (),
) -> dict[str, Any]:
    """Run warm-ups (not measured), then ``spec.num_prompts`` measured requests.

    Returns a dict with the header keys (``date, backend, model_id, num_prompts,
    request_rate, max_concurrency``), the point's ``isl``/``osl``, every key of ``POINT_KEYS``,
    ``errors`` (up to five messages), and the client's CPU use (``client_cpu_s``,
    ``client_cpu_ms_per_request``, ``client_cpu_util``). With ``keep_results`` the raw
    ``RequestResult`` list is returned under ``"_results"`` (not JSON). ``probes``: objects
    with ``begin()`` and ``end()``, called around the measured requests.
    """
    if spec.max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {spec.max_concurrency}")
    if spec.num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {spec.num_prompts}")
    if not (spec.request_rate > 0):
        raise ValueError(f"request_rate must be > 0 or inf, got {spec.request_rate}")
    if not (spec.burstiness > 0):
        raise ValueError(f"burstiness must be > 0 or inf, got {spec.burstiness}")
    # Warm-ups use their own prompts so the measured ones never hit a warmed prefix cache.
    warm_prompts = make_prompts(tok, spec.num_warmups, spec.isl, seed=spec.seed + 1_000_003)
    prompts = make_prompts(tok, spec.num_prompts, spec.isl, seed=spec.seed)
    wp = build_payloads(model_id, warm_prompts, spec.osl, ignore_eos)
    payloads = build_payloads(model_id, prompts, spec.osl, ignore_eos)
    results, duration, cpu = asyncio.run(
        _run_with_warmup(
            base_url,
            wp,
            payloads,
            spec.max_concurrency,
            spec.request_rate,
            spec.seed,
            spec.burstiness,
            probes,
        )
    )
    out: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": backend,
        "model_id": model_id,
        "num_prompts": spec.num_prompts,
        "request_rate": "inf" if spec.request_rate == float("inf") else spec.request_rate,
        "max_concurrency": spec.max_concurrency,
        "burstiness": "inf" if spec.burstiness == float("inf") else spec.burstiness,
        "isl": spec.isl,
        "osl": spec.osl,
        "num_warmups": spec.num_warmups,
        "ignore_eos": ignore_eos,
        "seed": spec.seed,
    }
    out.update(compute_metrics(results, duration, tok))
    out["errors"] = [r.error for r in results if not r.success][:5]
    out["client_cpu_s"] = cpu
    out["client_cpu_ms_per_request"] = cpu / len(results) * 1000.0
    out["client_cpu_util"] = cpu / duration if duration > 0 else 0.0
    if keep_results:
        out["_results"] = results
    return out


def check_failures(point: dict[str, Any], max_failed_share: float) -> None:
    """Raise ``TooManyFailures`` when a point's failed share is above ``max_failed_share``."""
    total = point["completed"] + point["failed"]
    share = point["failed"] / total if total else 1.0
    if share > max_failed_share:
        errs = "; ".join(point.get("errors", [])[:3])
        raise TooManyFailures(
            f"{point['failed']} of {total} requests failed ({share:.1%} > max_failed_share "
            f"{max_failed_share:.1%}) at isl={point.get('isl')} osl={point.get('osl')} "
            f"max_concurrency={point.get('max_concurrency')}; first errors: {errs}"
        )


def probe_ignore_eos(base_url: str, model_id: str, timeout: float = 60.0) -> bool:
    """Whether the server accepts ``ignore_eos`` (``transformers serve`` answers 422)."""
    r = requests.post(
        base_url.rstrip("/") + "/v1/completions",
        json={"model": model_id, "prompt": "Hello", "max_tokens": 1, "ignore_eos": True},
        timeout=timeout,
    )
    return r.status_code == 200
