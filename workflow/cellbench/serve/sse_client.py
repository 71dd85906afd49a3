"""The load generator's HTTP/1.1 client for streamed ``/v1/completions`` (keep-alive pool, plain
``http://`` only): each SSE event is parsed inside ``data_received`` and timestamped there, as
``vllm bench serve``'s client does per message, and each request's outcome is one
``RequestResult``.

Split out of ``cellbench.serve.loadgen``: the wire protocol, apart from the
prompts (``cellbench.serve.random_prompts``) and the points and their metrics (``loadgen``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

REQUEST_TIMEOUT_S = 6 * 60 * 60.0  # as vllm bench serve's aiohttp timeout


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


class SSEClient:
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
