"""Every measured request kept: per point, one record with ``vllm bench serve --save-detailed``'s
per-request keys, so any statistic can be recomputed from the raw data later.

A side's records go to one gzip-compressed JSON-lines file beside its bench.json
(``requests.jsonl.gz``, or ``requests-IMAGE.jsonl.gz`` in an image comparison), one line per
point, in the order the points ran, with a ``.sha256`` sidecar. Each line holds the point's
``seq`` (its key in bench.json) and these lists, one entry per request in send order:

* ``input_lens``   prompt tokens asked for;
* ``output_lens``  output tokens (the server's usage, else the text re-tokenised; 0 when the
  request failed, as vLLM records it);
* ``ttfts``        seconds to the first token (0 when failed);
* ``itls``         the gaps between later chunks, seconds (a list per request);
* ``latencies``    seconds from send to the last chunk (E2EL; 0 when failed);
* ``start_times``  send time, seconds after the point's first request was sent (vLLM saves
  the client's clock; an offset is what re-analysis needs);
* ``errors``       '' for a successful request, else the error text.

Generated texts are not kept (vLLM's ``generated_texts``): they can be large, and no latency
figure needs them. ``results.load_requests`` reads the file back (checksum checked);
``recompute_point`` recomputes the point's summary from it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cellbench.common import atomicio
from cellbench.contracts import load_shapes

DETAIL_KEYS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
)
FILE_NAME = "requests.jsonl.gz"


def file_name(side: str | None = None) -> str:
    """The sidecar's name: ``requests.jsonl.gz``, or ``requests-SIDE.jsonl.gz``."""
    return FILE_NAME if side is None else f"requests-{side}.jsonl.gz"


def output_len(result: Any, tok: Any = None) -> int:
    """A request's output tokens as the load generator counts them (loadgen.compute_metrics)."""
    if not result.success:
        return 0
    n = result.output_tokens
    if not n:
        n = len(tok.encode(result.generated_text)) if tok is not None else 0
    return int(n)


def detail_of(results: Sequence[Any], tok: Any = None) -> dict[str, list]:
    """The per-request lists of one point from loadgen's ``RequestResult`` list."""
    t0 = min((r.start for r in results), default=0.0)
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [output_len(r, tok) for r in results],
        "ttfts": [r.ttft if r.success else 0.0 for r in results],
        "itls": [list(r.itl) if r.success else [] for r in results],
        "latencies": [r.latency if r.success else 0.0 for r in results],
        "start_times": [r.start - t0 for r in results],
        "errors": ["" if r.success else (r.error or "failed") for r in results],
    }


def record(point: Mapping[str, Any], detail: Mapping[str, list]) -> dict[str, Any]:
    """One line of the sidecar: the point's identity and its per-request lists."""
    keys = ("seq", "repeat", "isl", "osl", "load_shape", "max_concurrency", "request_rate")
    head = {k: point.get(k) for k in keys + ("burstiness", "duration", "image") if k in point}
    return {**head, **{k: detail[k] for k in DETAIL_KEYS}}


def write(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write the records, compressed, atomically, with a checksum sidecar."""
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    # mtime 0: the same records give the same bytes, so the checksum says what changed.
    try:
        atomicio.write_bytes(path, gzip.compress(lines.encode(), mtime=0), checksum=True)
    except OSError as e:  # e.g. a full disk: say which file could not be written
        raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e


def stats_ms(values: Sequence[float]) -> dict[str, float]:
    """Mean, median, std, p90 and p99 in ms of values in seconds; vLLM reports 0 when there
    is nothing to summarise (e.g. every request failed), and so does this."""
    arr = np.asarray(list(values) or [0.0], dtype=float) * 1000.0
    return {
        "mean": float(np.mean(arr)),
        "median": float(np.median(arr)),
        "std": float(np.std(arr)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
    }


def recompute_point(
    rec: Mapping[str, Any], slo_ms: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """A point's summary recomputed from its requests alone: completed/failed, output tokens
    and ``{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms`` with loadgen's definitions (failed
    requests left out) with each metric's requests (``ttft_requests``, ...), plus goodput
    when ``slo_ms`` is given and ``duration`` was kept."""
    ok = [i for i, e in enumerate(rec["errors"]) if not e]
    ttfts = [rec["ttfts"][i] for i in ok]
    e2els = [rec["latencies"][i] for i in ok]
    outs = [rec["output_lens"][i] for i in ok]
    tpots = [(e2el - t) / (n - 1) for t, e2el, n in zip(ttfts, e2els, outs, strict=True) if n > 1]
    itls = [gap for i in ok for gap in rec["itls"][i]]
    out: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(rec["errors"]) - len(ok),
        "total_output_tokens": int(sum(outs)),
    }
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        for stat, v in stats_ms(vals).items():
            out[f"{stat}_{name}_ms"] = v
    with_gaps = sum(1 for i in ok if rec["itls"][i])
    counts = {"ttft": len(ttfts), "tpot": len(tpots), "itl": with_gaps, "e2el": len(e2els)}
    out.update({f"{name}_requests": n for name, n in counts.items()})
    if slo_ms and rec.get("duration"):
        out["goodput"] = load_shapes.goodput(
            rec["ttfts"],
            rec["latencies"],
            rec["output_lens"],
            rec["errors"],
            rec["duration"],
            slo_ms,
        )
    return out
