"""An OpenAI-compatible completions server with known timing, for tests and benchmarks.

It serves ``/health``, ``/v1/models``, ``/tokenize``, ``/detokenize``, ``/v1/completions``
(streaming and not) and ``/v1/chat/completions`` (not streamed). A streamed completion sends
its first token ``ttft_ms`` after the request arrives and each further token ``itl_ms`` after
the previous one; token times are scheduled on an absolute clock so event-loop lateness does
not accumulate, counted from the first token's real send so that a late first token does not
squeeze the later ones together (no decoder catches up that way). Every completion's real
send times are kept and served at ``GET /stats`` (keyed by the response ``id``), so a client's
measurements can be checked against what the server actually did, not only against the
configured values.

Tokens are the words ``w0 .. w{vocab-1}``; ``/tokenize`` splits on whitespace.

Fault injection (to exercise callers' error paths with a real process):
``--fail-share F`` answers that share of completion requests with HTTP 500 (spread evenly, the
first one always succeeds); ``--exit-after N`` kills the process when completion request N+1
arrives; ``--never-ready`` keeps ``/health`` at 503; ``--exit-at-start`` exits with status 3
during start-up; ``--reject-ignore-eos`` answers 422 to ``ignore_eos`` as ``transformers serve``
does; ``--style transformers`` puts ``usage`` on the last token chunk and omits ``[DONE]``;
``--completion-text T`` answers non-streamed requests with ``T`` (e.g. a GSM8K answer);
``--burst-requests N-M`` holds streamed completion requests N..M-1 (counted from 0, as
``--exit-after`` counts) until their last token is due and then sends all their tokens at once,
``--burst-style chunk`` in one SSE chunk, ``events`` one chunk per token back to back (a server
that buffers its stream, as one vLLM image did intermittently);
``--ttft-ms-per-active X`` adds X ms to a completion's first token per other completion in flight
when it arrives (a queue in front of a batched server: latency grows with load, so a capacity
search has a boundary to find);
``--moe-log none`` leaves out the fused-MoE config line it logs at start-up (as vLLM would,
from ``VLLM_TUNED_CONFIG_FOLDER``), as a server without a Triton MoE path would.

    python -m cellbench.serve.timed_server --port P --ttft-ms X --itl-ms Y
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

STANDIN_CONFIG_NAME = "E=8,N=32,device_name=STANDIN.json"


@dataclass
class TimedServerConfig:
    """Behaviour of the timed server (see module docstring)."""

    model_id: str = "timed-model"
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    default_max_tokens: int = 16
    eos_after: int | None = None  # without ignore_eos, stop after this many tokens
    vocab_size: int = 1000
    max_model_len: int = 65536
    fail_share: float = 0.0
    exit_after: int | None = None
    never_ready: bool = False
    ready_delay_s: float = 0.0
    reject_ignore_eos: bool = False
    style: str = "vllm"  # or "transformers"
    completion_text: str | None = None  # fixed answer text instead of "w0 w7 ..." tokens
    burst_requests: tuple[int, int] | None = None  # [first, end) of requests sent in a burst
    burst_style: str = "chunk"  # or "events"
    ttft_ms_per_active: float = 0.0  # added to TTFT per other completion in flight


@dataclass
class _State:
    cfg: TimedServerConfig
    started: float = field(default_factory=time.monotonic)
    n_completions: int = 0
    n_failed: int = 0
    n_chat: int = 0  # chat requests among n_completions
    stats: dict[str, dict] = field(default_factory=dict)
    active: int = 0  # completion requests in flight


def _encode(text: str, vocab: int) -> list[int]:
    out = []
    for w in text.split():
        if w.startswith("w") and w[1:].isdigit() and int(w[1:]) < vocab:
            out.append(int(w[1:]))
        else:
            out.append(sum(w.encode()) % vocab)
    return out


def _decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def _should_fail(i: int, share: float) -> bool:
    # Request i fails when the running count of failures owed steps up: even spread, i=0 passes.
    return math.floor((i + 1) * share) > math.floor(i * share)


def _json_error(status: int, msg: str) -> web.Response:
    return web.json_response({"error": {"message": msg, "code": status}}, status=status)


async def _health(request: web.Request) -> web.Response:
    st: _State = request.app["state"]
    if st.cfg.never_ready or time.monotonic() - st.started < st.cfg.ready_delay_s:
        return web.Response(status=503, text="not ready")
    return web.Response(status=200)


async def _models(request: web.Request) -> web.Response:
    st: _State = request.app["state"]
    data = [{"id": st.cfg.model_id, "object": "model", "owned_by": "cellbench", "created": 0}]
    return web.json_response({"object": "list", "data": data})


async def _tokenize(request: web.Request) -> web.Response:
    st: _State = request.app["state"]
    body = await request.json()
    toks = _encode(str(body.get("prompt", "")), st.cfg.vocab_size)
    return web.json_response(
        {"tokens": toks, "count": len(toks), "max_model_len": st.cfg.max_model_len}
    )


async def _detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"prompt": _decode([int(t) for t in body.get("tokens", [])])})


async def _stats(request: web.Request) -> web.Response:
    st: _State = request.app["state"]
    return web.json_response(
        {
            "n_completions": st.n_completions,
            "n_chat": st.n_chat,
            "n_failed": st.n_failed,
            "requests": st.stats,
        }
    )


async def _counted_completions(request: web.Request) -> web.StreamResponse:
    """A completion, with the others in flight at its arrival counted (--ttft-ms-per-active)."""
    st: _State = request.app["state"]
    request["others_in_flight"] = st.active
    st.active += 1
    try:
        return await _completions(request)
    finally:
        st.active -= 1


async def _completions(request: web.Request) -> web.StreamResponse:
    recv = time.perf_counter()
    st: _State = request.app["state"]
    cfg = st.cfg
    i = st.n_completions
    st.n_completions += 1
    if cfg.exit_after is not None and i >= cfg.exit_after:
        print(f"timed_server: exiting on purpose at completion request {i}", flush=True)
        os._exit(4)
    body = await request.json()
    if cfg.reject_ignore_eos and ("ignore_eos" in body or "min_tokens" in body):
        return _json_error(422, "Unexpected fields in the request: {'ignore_eos'}")
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one, as some clients send
    if not isinstance(prompt, str):
        return _json_error(422, "prompt must be a string")
    if cfg.fail_share > 0 and _should_fail(i, cfg.fail_share):
        st.n_failed += 1
        return _json_error(500, f"injected failure on request {i}")
    max_tokens = int(body.get("max_tokens") or cfg.default_max_tokens)
    n_out = max_tokens
    if cfg.eos_after is not None and not body.get("ignore_eos", False):
        n_out = min(n_out, cfg.eos_after)
    n_out = max(n_out, 1)
    n_in = len(_encode(prompt, cfg.vocab_size))
    rid = f"cmpl-{uuid.uuid4().hex}"
    usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    first_sent: list[float] = []  # loop time the first streamed token went out
    ttft_ms = cfg.ttft_ms + cfg.ttft_ms_per_active * request.get("others_in_flight", 0)

    async def wait_until(k: int) -> None:
        # Absolute schedule: token k is due at ttft + k * itl after arrival, later tokens
        # k * itl after the first one really went.
        base = first_sent[0] if first_sent else t0 + ttft_ms / 1000.0
        due = base + k * cfg.itl_ms / 1000.0
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    if not body.get("stream", False):
        await wait_until(n_out - 1)
        text = _decode([(7 * k) % cfg.vocab_size for k in range(n_out)])
        if cfg.completion_text is not None:
            text = cfg.completion_text
        return web.json_response(
            {
                "id": rid,
                "object": "text_completion",
                "model": cfg.model_id,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage,
            }
        )

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    sends: list[float] = []

    def chunk(choices: list[dict], with_usage: bool = False) -> bytes:
        d: dict = {"id": rid, "object": "text_completion", "model": cfg.model_id}
        d["choices"] = choices
        if with_usage:
            d["usage"] = usage
        return b"data: " + json.dumps(d).encode() + b"\n\n"

    burst = cfg.burst_requests is not None and cfg.burst_requests[0] <= i < cfg.burst_requests[1]
    texts = [f" w{(7 * k) % cfg.vocab_size}" for k in range(n_out)]
    finish = "length" if n_out == max_tokens else "stop"
    if burst and cfg.burst_style == "chunk":
        await wait_until(n_out - 1)
        one = {"index": 0, "text": "".join(texts), "finish_reason": finish}
        await resp.write(chunk([one], with_usage=cfg.style == "transformers"))
        sends.append(time.perf_counter())
    for k in range(0 if not burst or cfg.burst_style == "events" else n_out, n_out):
        await wait_until(n_out - 1 if burst else k)
        last = k == n_out - 1
        choice: dict = {"index": 0, "text": texts[k]}
        if last:
            choice["finish_reason"] = finish
        tf_last = last and cfg.style == "transformers"
        await resp.write(chunk([choice], with_usage=tf_last))
        sends.append(time.perf_counter())
        if k == 0 and not burst:
            first_sent.append(loop.time())
    if cfg.style != "transformers":
        if include_usage:
            await resp.write(chunk([], with_usage=True))
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    st.stats[rid] = {
        "recv": recv,
        "first": sends[0],
        "last": sends[-1],
        "n": n_out,
        "ttft_ms": (sends[0] - recv) * 1000.0,
        "tpot_ms": ((sends[-1] - sends[0]) / (n_out - 1) * 1000.0) if n_out > 1 else None,
    }
    return resp


async def _chat_completions(request: web.Request) -> web.Response:
    """``/v1/chat/completions``, not streamed (as lm-eval's local-chat-completions asks): the
    reply is ``--completion-text`` or the usual word tokens, after the same timing."""
    st: _State = request.app["state"]
    cfg = st.cfg
    i = st.n_completions
    st.n_completions += 1
    st.n_chat += 1
    body = await request.json()
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        return _json_error(422, "messages must be a list of {role, content} objects")
    if body.get("stream"):
        return _json_error(422, "the timed server answers chat requests unstreamed only")
    if cfg.fail_share > 0 and _should_fail(i, cfg.fail_share):
        st.n_failed += 1
        return _json_error(500, f"injected failure on request {i}")
    n_out = max(int(body.get("max_tokens") or cfg.default_max_tokens), 1)
    await asyncio.sleep((cfg.ttft_ms + (n_out - 1) * cfg.itl_ms) / 1000.0)
    text = cfg.completion_text
    if text is None:
        text = _decode([(7 * k) % cfg.vocab_size for k in range(n_out)])
    n_in = sum(len(_encode(m["content"], cfg.vocab_size)) for m in messages)
    return web.json_response(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "model": cfg.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": n_in,
                "completion_tokens": n_out,
                "total_tokens": n_in + n_out,
            },
        }
    )


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launch(*args: str, port: int | None = None, wait_ready: bool = True, timeout_s: float = 20.0):
    """Run the timed server as a subprocess; yield ``(base_url, process)``; stop it after.

    ``args`` are extra command-line flags (e.g. ``"--ttft-ms", "100"``).
    """
    import requests

    port = port or free_port()
    cmd = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while wait_ready:
            if proc.poll() is not None:
                raise RuntimeError(f"timed server exited with {proc.returncode}: {cmd}")
            try:
                if requests.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed server not ready within {timeout_s} s: {cmd}")
            time.sleep(0.05)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_app(cfg: TimedServerConfig) -> web.Application:
    """Build the aiohttp application for ``cfg``."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app["state"] = _State(cfg)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_post("/v1/completions", _counted_completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/stats", _stats)
    return app


def moe_config_line(folder: str | None) -> str:
    """The line vLLM logs about its fused-MoE config, as this stand-in would have it: the first
    JSON file of ``VLLM_TUNED_CONFIG_FOLDER`` when there is one, else vLLM's default. It loads
    nothing (no MoE runs here); it lets a caller's evidence check run against a real process."""
    files = sorted(Path(folder).glob("*.json")) if folder and Path(folder).is_dir() else []
    if files:
        return f"INFO timed_server: Using configuration from {files[0]} for MoE layer."
    where = f"{folder}/{STANDIN_CONFIG_NAME}" if folder else STANDIN_CONFIG_NAME
    return (
        "WARNING timed_server: Using default MoE config. Performance might be sub-optimal! "
        f"Config file not found at {where}"
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see module docstring)."""
    p = argparse.ArgumentParser(prog="python -m cellbench.serve.timed_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-id", default="timed-model")
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms-per-active", type=float, default=0.0)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--eos-after", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--fail-share", type=float, default=0.0)
    p.add_argument("--exit-after", type=int, default=None)
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--ready-delay-s", type=float, default=0.0)
    p.add_argument("--exit-at-start", action="store_true")
    p.add_argument("--reject-ignore-eos", action="store_true")
    p.add_argument("--style", choices=["vllm", "transformers"], default="vllm")
    p.add_argument("--completion-text", default=None, help="fixed non-streamed answer text")
    p.add_argument("--burst-requests", default=None, help="N-M: requests sent in one burst")
    p.add_argument("--burst-style", choices=["chunk", "events"], default="chunk")
    p.add_argument("--keepalive-timeout", type=float, default=75.0, help="idle keep-alive, s")
    p.add_argument(
        "--moe-log",
        choices=["vllm", "none"],
        default="vllm",
        help="vllm: log the fused-MoE config line vLLM would (stand-in: nothing is loaded)",
    )
    a = p.parse_args(argv)
    if not 0.0 <= a.fail_share <= 1.0:
        p.error(f"--fail-share must be within [0, 1], got {a.fail_share}")
    burst = None
    if a.burst_requests is not None:
        first, _, end = a.burst_requests.partition("-")
        if not (first.isdigit() and end.isdigit() and int(first) < int(end)):
            p.error(f"--burst-requests must be N-M with N < M, got {a.burst_requests!r}")
        burst = (int(first), int(end))
    print(f"timed_server: starting on {a.host}:{a.port}", flush=True)
    if a.moe_log == "vllm":
        print(moe_config_line(os.environ.get("VLLM_TUNED_CONFIG_FOLDER")), flush=True)
    if a.exit_at_start:
        time.sleep(0.3)
        print("timed_server: failing start-up on purpose (--exit-at-start)", flush=True)
        return 3
    cfg = TimedServerConfig(
        model_id=a.model_id,
        ttft_ms=a.ttft_ms,
        itl_ms=a.itl_ms,
        default_max_tokens=a.default_max_tokens,
        eos_after=a.eos_after,
        vocab_size=a.vocab_size,
        fail_share=a.fail_share,
        exit_after=a.exit_after,
        never_ready=a.never_ready,
        ready_delay_s=a.ready_delay_s,
        reject_ignore_eos=a.reject_ignore_eos,
        style=a.style,
        completion_text=a.completion_text,
        burst_requests=burst,
        burst_style=a.burst_style,
        ttft_ms_per_active=a.ttft_ms_per_active,
    )
    web.run_app(
        make_app(cfg),
        host=a.host,
        port=a.port,
        print=None,
        access_log=None,
        backlog=4096,
        keepalive_timeout=a.keepalive_timeout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
