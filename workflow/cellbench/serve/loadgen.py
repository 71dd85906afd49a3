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
* mean/median/std/p99 with numpy over successful requests; failed requests are counted and
  left out of every statistic. Streams that end without ``data: [DONE]`` are fine.

Prompts are random token sequences of exactly ``isl`` tokens under the model's tokenizer (a
local ``tokenizer.json``/``transformers`` tokenizer, or the server's ``/tokenize`` and
``/detokenize``), drawn from a fixed seed (as are Poisson arrival times when the request rate
is finite). Requests use temperature 0, ``max_tokens = osl`` and, when the server accepts it,
``ignore_eos``; real output lengths are recorded, never assumed.

Requests go through a small HTTP/1.1 client of this module (``_Client``: keep-alive pool, plain
``http://`` only) that handles each SSE event inside ``data_received`` and timestamps it there,
so hundreds of concurrent streams add little lag to the recorded times; an aiohttp client that
wakes a coroutine per chunk measured TPOT 2.5-8% high at concurrency 256 on 2 CPUs, this one
stays under 1% (``benchmarks/loadgen_accuracy.py``). The client's own CPU time per request is
recorded with each point so a result can show the client was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import requests

from cellbench.serve import load_shapes

REQUEST_TIMEOUT_S = 6 * 60 * 60.0  # as vllm bench serve's aiohttp timeout

# Keys of one measured point, in the order vLLM saves them.
METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
STAT_NAMES = ("mean", "median", "std", "p99")
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


_COMMON_WORDS = (
    "the of and to in is was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people "
    "my over know water than call first who may down side been now find any new work part "
    "take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low "
    "line differ turn cause much mean before move right boy old too same tell does set three "
    "want air well also play small end put home read hand port large spell add even land here "
    "must big high such follow act why ask men change went light kind off need house picture "
    "try us again animal point mother world near build self earth father head stand own page"
).split()


class Tokenizer(Protocol):
    """The little the load generator needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def candidate_ids(self) -> list[int]: ...


class LocalTokenizer:
    """A ``tokenizers`` tokenizer loaded from a model directory's ``tokenizer.json``."""

    def __init__(self, model_dir: Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model dir {model_dir}")
        self._tok = HFTokenizer.from_file(str(path))
        special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        vocab = self._tok.get_vocab(with_added_tokens=True)
        ids = sorted(i for t, i in vocab.items() if t not in special)
        # Prefer " word" tokens that round-trip alone: joined, they split back at the spaces
        # into the same ids, so random prompts have their intended length at the first try.
        stable = []
        for i in ids:
            text = self._tok.decode([i])
            if len(text) > 1 and text[0] == " " and text[1:].isalnum() and self.encode(text) == [i]:
                stable.append(i)
        self._ids = stable if len(stable) >= 50 else ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def candidate_ids(self) -> list[int]:
        return self._ids


class ServerTokenizer:
    """Tokenise through a server's ``/tokenize`` and ``/detokenize`` (vLLM has both)."""

    def __init__(self, base_url: str, model_id: str, vocab_size: int | None = None):
        self._base = base_url.rstrip("/")
        self._model = model_id
        self._s = requests.Session()
        self._vocab = vocab_size
        self._candidates: list[int] | None = None

    def encode(self, text: str) -> list[int]:
        r = self._s.post(
            f"{self._base}/tokenize",
            json={"model": self._model, "prompt": text, "add_special_tokens": False},
            timeout=60,
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    def decode(self, ids: Sequence[int]) -> str:
        r = self._s.post(
            f"{self._base}/detokenize",
            json={"model": self._model, "tokens": list(ids)},
            timeout=60,
        )
        r.raise_for_status()
        return str(r.json()["prompt"])

    def candidate_ids(self) -> list[int]:
        # The vocabulary is not served, so learn ids from common words: " word" tokens join and
        # split back cleanly, where arbitrary ids (byte pieces) would not round-trip.
        if self._candidates is None:
            ids = sorted(set(self.encode(" " + " ".join(_COMMON_WORDS))))
            self._candidates = (
                ids if len(ids) >= 50 else list(range(min(self._vocab or 1000, 1000)))
            )
        return self._candidates


def load_tokenizer(model: str, base_url: str | None = None, model_id: str | None = None):
    """A local tokenizer when ``model`` is a directory with tokenizer.json, else the server's."""
    p = Path(model)
    if (p / "tokenizer.json").is_file():
        return LocalTokenizer(p)
    if base_url is None:
        raise ValueError(f"model {model!r} has no local tokenizer.json and no server was given")
    return ServerTokenizer(base_url, model_id or model)


@dataclass
class Prompt:
    """One request's prompt and its true length in tokens."""

    text: str
    prompt_len: int


def make_prompts(tok: Tokenizer, n: int, isl: int, seed: int) -> list[Prompt]:
    """``n`` random prompts of exactly ``isl`` tokens (re-encoded until stable)."""
    if isl < 1:
        raise ValueError(f"isl must be >= 1, got isl={isl}")
    rng = random.Random(seed)
    ids_pool = tok.candidate_ids()
    out: list[Prompt] = []
    for _ in range(n):
        ids = [rng.choice(ids_pool) for _ in range(isl)]
        text = tok.decode(ids)
        for _attempt in range(20):
            ids = tok.encode(text)
            if len(ids) == isl:
                break
            # Decoding and re-encoding can merge or split tokens: trim or top up, then retry.
            ids = ids[:isl] if len(ids) > isl else ids + [rng.choice(ids_pool)]
            text = tok.decode(ids)
        else:
            raise RuntimeError(f"could not make a prompt of exactly {isl} tokens")
        out.append(Prompt(text, isl))
    return out


@dataclass
class RequestResult:
    """What one request produced, as ``vllm bench serve`` records it."""

    success: bool = False
    prompt_len: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None
    prompt_tokens: int | None = None  # the server's usage.prompt_tokens, when it sends usage
    generated_text: str = ""
    response_id: str | None = None
    error: str = ""
    start: float = 0.0


class _SSEResponse(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that parses a streamed completion as bytes arrive.

    Each SSE event is parsed inside ``data_received`` and timestamped as it is parsed (not once
    per socket read, which gave every event of a burst the same time): no per-chunk task
    switch, so many concurrent streams add little lag to the times recorded. Handles chunked
    and Content-Length bodies and streams that end without ``data: [DONE]``.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self._reset(None)

    def _reset(self, out: RequestResult | None) -> None:
        self.out = out
        self.done: asyncio.Future | None = None
        self._head = bytearray()
        self._in_body = False
        self._status = 0
        self._chunked = False
        self._remaining: int | None = None  # Content-Length left, or chunk bytes left
        self._chunk_state = "size"  # size | data | crlf | trailer
        self._raw = bytearray()  # undecoded transfer-encoding bytes
        self._line = bytearray()  # partial SSE line
        self._body_err = bytearray()
        self._got_first = False
        self._last = 0.0
        self._text: list[str] = []
        self.got_bytes = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.out is not None and self.done is not None and not self.done.done():
            if self._in_body and not self._chunked and self._remaining is None:
                self._finish()  # body delimited by the connection closing
            else:
                self._fail(f"connection lost: {exc or 'closed by server'}")

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.out is None:
            self.reusable = False  # bytes nobody asked for: do not trust this connection
            return
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._head[:end]).decode("latin-1").split("\r\n")
            data = bytes(self._head[end + 4 :])
            try:
                self._status = int(head[0].split()[1])
            except (IndexError, ValueError):
                self._fail(f"bad HTTP status line: {head[0][:100]!r}")
                return
            hdrs = {}
            for h in head[1:]:
                k, _, v = h.partition(":")
                hdrs[k.strip().lower()] = v.strip().lower()
            self._chunked = "chunked" in hdrs.get("transfer-encoding", "")
            if not self._chunked and "content-length" in hdrs:
                self._remaining = int(hdrs["content-length"])
            if hdrs.get("connection") == "close":
                self.reusable = False
            self._in_body = True
        if data:
            self._body(data)
        if not self._chunked and self._remaining == 0:
            self._finish()

    # -- body decoding
    def _body(self, data: bytes) -> None:
        if not self._chunked:
            if self._remaining is not None:
                data = data[: self._remaining]
                self._remaining -= len(data)
            self._payload(data)
            return
        self._raw += data
        while self._raw:
            if self._chunk_state == "size":
                nl = self._raw.find(b"\r\n")
                if nl < 0:
                    return
                size = int(bytes(self._raw[:nl]).split(b";")[0], 16)
                del self._raw[: nl + 2]
                if size == 0:
                    self._chunk_state = "trailer"
                else:
                    self._remaining, self._chunk_state = size, "data"
            elif self._chunk_state == "data":
                take = bytes(self._raw[: self._remaining])
                del self._raw[: len(take)]
                self._remaining -= len(take)
                self._payload(take)
                if self._remaining == 0:
                    self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(self._raw) < 2:
                    return
                del self._raw[:2]
                self._chunk_state = "size"
            else:  # trailer: ends with an empty line
                if self._raw.startswith(b"\r\n"):
                    del self._raw[:2]
                    self._finish()
                    return
                nl = self._raw.find(b"\r\n")
                if nl < 0:
                    return
                del self._raw[: nl + 2]

    def _payload(self, data: bytes) -> None:
        if self._status != 200:
            self._body_err += data
            return
        self._line += data
        while True:
            nl = self._line.find(b"\n")
            if nl < 0:
                return
            line = bytes(self._line[:nl]).strip()
            del self._line[: nl + 1]
            self._event(line)

    def _event(self, line: bytes) -> None:
        # Same rules as vllm bench serve: skip blanks and SSE comments, "[DONE]" is optional.
        if not line or line.startswith(b":"):
            return
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if line == b"[DONE]":
            return
        out = self.out
        assert out is not None
        try:
            data = json.loads(line)
        except ValueError:
            out.error = f"unparsable stream line: {line[:100]!r}"
            return
        if choices := data.get("choices"):
            ts = time.perf_counter()  # this event's own time, as vllm bench serve takes it
            if not self._got_first:
                self._got_first = True
                out.ttft = ts - out.start
                out.response_id = data.get("id")
            else:
                out.itl.append(ts - self._last)
            self._last = ts
            self._text.append(choices[0].get("text") or "")
        if usage := data.get("usage"):
            out.output_tokens = usage.get("completion_tokens")
            out.prompt_tokens = usage.get("prompt_tokens")

    def _finish(self) -> None:
        out = self.out
        if out is None or self.done is None or self.done.done():
            return
        if self._line.strip():
            self._event(bytes(self._line).strip())
        if self._status != 200:
            body = bytes(self._body_err[:300]).decode(errors="replace")
            out.error = f"HTTP {self._status}: {body}"
        elif self._got_first and not out.error:
            out.success = True
            out.latency = self._last - out.start
        elif not out.error:
            out.error = "stream ended without any chunk carrying choices"
        out.generated_text = "".join(self._text)
        self.done.set_result(out)

    def _fail(self, msg: str) -> None:
        self.reusable = False
        if self.out is not None and self.done is not None and not self.done.done():
            self.out.error = msg
            self.out.success = False
            self.done.set_result(self.out)

    # -- one request on this connection
    def send(self, head: bytes, body: bytes, out: RequestResult) -> asyncio.Future:
        self._reset(out)
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(head + body)
        return self.done


class _Client:
    """A pool of keep-alive connections to one ``http://host:port``."""

    def __init__(self, base_url: str, timeout_s: float = REQUEST_TIMEOUT_S):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"load generator needs an http://host:port base URL, got {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.path = (u.path.rstrip("/") or "") + "/v1/completions"
        self.timeout_s = timeout_s
        self._idle: list[_SSEResponse] = []

    def head(self, n: int) -> bytes:
        return (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Connection: keep-alive\r\nContent-Length: {n}\r\n\r\n"
        ).encode()

    async def request(self, payload: bytes, prompt_len: int) -> RequestResult:
        start = time.perf_counter()  # before any connect, as vllm bench serve does
        for attempt in (0, 1):
            out = RequestResult(prompt_len=prompt_len, start=start)
            conn, reused = None, False
            try:
                while self._idle:
                    c = self._idle.pop()
                    if c.reusable and c.transport is not None and not c.transport.is_closing():
                        conn, reused = c, True
                        break
                if conn is None:
                    loop = asyncio.get_running_loop()
                    _, conn = await loop.create_connection(_SSEResponse, self.host, self.port)
                fut = conn.send(self.head(len(payload)), payload, out)
                await asyncio.wait_for(fut, self.timeout_s)
            except Exception as e:  # noqa: BLE001 - every failure is recorded, not raised
                out.success = False
                out.error = out.error or f"{type(e).__name__}: {e}"
                if conn is not None:
                    conn.reusable = False
            if conn is not None:
                got_bytes = conn.got_bytes
                conn.out = None
                if conn.reusable and out.success:
                    self._idle.append(conn)
                elif conn.transport is not None:
                    conn.transport.close()
                # A keep-alive connection the server closed while idle fails before any byte
                # comes back; that is the pool's fault, not the server's: retry once, fresh.
                if not out.success and reused and not got_bytes and attempt == 0:
                    continue
            return out
        return out

    def close(self) -> None:
        for c in self._idle:
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()


def _request_times(
    n: int, rate: float, rng: np.random.Generator, burstiness: float = 1.0
) -> list[float]:
    """Send offsets in seconds: all zero for rate inf, else gamma gaps (load_shapes)."""
    return load_shapes.arrival_offsets(n, rate, burstiness, rng)


async def _run_batch(
    client: _Client,
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
    client = _Client(base_url)
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


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    # vLLM reports 0 when there is nothing to summarise (e.g. every request failed).
    arr = np.asarray(values or [0.0], dtype=float) * scale
    return {
        "mean": float(np.mean(arr)),
        "median": float(np.median(arr)),
        "std": float(np.std(arr)),
        "p99": float(np.percentile(arr, 99)),
    }


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
        for stat, v in _stats(vals).items():
            m[f"{stat}_{name}_ms"] = v
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
