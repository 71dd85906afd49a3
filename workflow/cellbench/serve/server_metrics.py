"""The server's own view of a measured point, from its Prometheus ``/metrics``.

``MetricsScraper`` reads ``/metrics`` once when the point's measured requests start (the
baseline), every ``interval_s`` while they run (a background thread), and once when they end.
The text is parsed with ``prometheus_client``'s parser. Stored per point:

* ``series``: for each gauge the server exports (vLLM: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, ...), ``[t_s, value]`` pairs,
  ``t_s`` in seconds after the baseline; label sets (engines, models) are summed, except
  fractions (``*_perc``), which are averaged;
* ``counters``: each counter's increase over the point (vLLM: prefix-cache queries and hits,
  preemptions, prompt and generation tokens);
* ``latency``: for each histogram of seconds (vLLM: TTFT, inter-token, TPOT, E2E, queue), the
  requests it counted during the point and their mean, p50/p90/p99 in ms from the bucket
  increases (linear inside a bucket, as Prometheus' ``histogram_quantile``), named by
  ``LATENCY_NAMES`` where known.

A server without ``/metrics`` (``transformers serve``), or whose answer is not Prometheus text,
gives ``{"available": false, "reason": ...}``; a scrape failing mid-point is counted
(``failed_scrapes``) and the point keeps what the other scrapes saw.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from typing import Any

import requests

DEFAULT_INTERVAL_S = 0.5
# vLLM's histograms under the names the client's figures use (older vLLM names included).
LATENCY_NAMES = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl",  # vLLM < 0.11: per-token gaps under this name
    "vllm:request_time_per_output_token_seconds": "tpot",
    "vllm:e2e_request_latency_seconds": "e2el",
    "vllm:request_queue_time_seconds": "queue",
    "vllm:request_prefill_time_seconds": "prefill",
    "vllm:request_decode_time_seconds": "decode",
}
QUANTILES = (0.5, 0.9, 0.99)
# The exporter's own process and HTTP figures, and the creation times prometheus_client adds
# as gauges: not the serving engine's state.
_NOT_ENGINE_PREFIXES = ("process_", "python_", "http_")
_NOT_ENGINE_SUFFIXES = ("_created", "_info")


def _engine_metric(name: str) -> bool:
    return not name.startswith(_NOT_ENGINE_PREFIXES) and not name.endswith(_NOT_ENGINE_SUFFIXES)


class Snapshot:
    """One parsed scrape: gauges, counters and histogram buckets, label sets merged."""

    def __init__(self, text: str):
        # Imported here: a reader of results (the report, the job type) needs no Prometheus.
        from prometheus_client.parser import text_string_to_metric_families

        self.gauges: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        # histogram name -> {"buckets": {le: cumulative count}, "sum": s, "count": n}
        self.histograms: dict[str, dict[str, Any]] = {}
        gauge_parts: dict[str, list[float]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            if not _engine_metric(family.name):
                continue
            if family.type == "gauge":
                for s in family.samples:
                    if _engine_metric(s.name):
                        gauge_parts[s.name].append(s.value)
            elif family.type == "counter":
                for s in family.samples:
                    if s.name.endswith("_total"):
                        self.counters[s.name] = self.counters.get(s.name, 0.0) + s.value
            elif family.type == "histogram":
                h = self.histograms.setdefault(
                    family.name, {"buckets": defaultdict(float), "sum": 0.0, "count": 0.0}
                )
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        h["buckets"][float(s.labels["le"])] += s.value
                    elif s.name.endswith("_sum"):
                        h["sum"] += s.value
                    elif s.name.endswith("_count"):
                        h["count"] += s.value
        for name, values in gauge_parts.items():
            self.gauges[name] = sum(values) / len(values) if name.endswith("_perc") else sum(values)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile from cumulative ``(upper bound, count)`` buckets, ascending, the last
    +Inf; None without observations. Inside a bucket, linear; in the +Inf bucket, the highest
    finite bound (what can be said)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, cum in buckets:
        if cum >= rank and cum > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (cum - below)
        lower, below = (upper if not math.isinf(upper) else lower), cum
    return lower


def latency_delta(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """Requests counted between two scrapes of one histogram of seconds, in ms."""
    b_buckets = before["buckets"] if before else {}
    buckets = sorted((le, after["buckets"][le] - b_buckets.get(le, 0.0)) for le in after["buckets"])
    count = after["count"] - (before["count"] if before else 0.0)
    total = after["sum"] - (before["sum"] if before else 0.0)
    out: dict[str, Any] = {"count": int(round(count))}
    out["mean_ms"] = total / count * 1000.0 if count > 0 else None
    for q in QUANTILES:
        v = bucket_quantile(q, buckets)
        out[f"p{round(q * 100)}_ms"] = None if v is None else v * 1000.0
    return out


class MetricsScraper:
    """Scrape ``base_url/metrics`` around and during one point (see the module docstring).

    ``begin()`` takes the baseline (and finds out whether there is a ``/metrics`` at all) and
    starts the thread; ``end()`` stops it, takes the last scrape and returns the point's
    record."""

    def __init__(self, base_url: str, interval_s: float = DEFAULT_INTERVAL_S):
        if not interval_s > 0:
            raise ValueError(f"metrics interval must be > 0 s, got {interval_s}")
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self._session = requests.Session()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._first: Snapshot | None = None
        self._last: Snapshot | None = None
        self._series: dict[str, list[list[float]]] = defaultdict(list)
        self._scrapes = 0
        self._failed = 0
        self._unavailable: str | None = None
        self._lock = threading.Lock()

    def _scrape(self) -> Snapshot:
        r = self._session.get(self.url, timeout=max(5.0, 4 * self.interval_s))
        if r.status_code != 200:
            raise RuntimeError(f"GET {self.url} answered HTTP {r.status_code}")
        snap = Snapshot(r.text)
        if not (snap.gauges or snap.counters or snap.histograms):
            raise RuntimeError(f"GET {self.url} returned no Prometheus metrics")
        return snap

    def _record(self, snap: Snapshot) -> None:
        t = time.monotonic() - self._t0
        with self._lock:
            self._scrapes += 1
            self._last = snap
            for name, value in snap.gauges.items():
                self._series[name].append([round(t, 4), value])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._record(self._scrape())
            except Exception:  # noqa: BLE001 - counted; the point keeps the other scrapes
                with self._lock:
                    self._failed += 1

    def begin(self) -> None:
        self._t0 = time.monotonic()
        try:
            self._first = self._scrape()
        except RuntimeError as e:  # answered, but not with Prometheus metrics
            self._unavailable = f"{e}: the server exports no Prometheus metrics there"
            return
        except Exception as e:  # noqa: BLE001 - the result says why there are no metrics
            self._unavailable = f"GET {self.url} failed: {type(e).__name__}: {e}"
            return
        self._record(self._first)
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()

    def end(self) -> dict[str, Any]:
        self.record = self._end()
        return self.record

    def _end(self) -> dict[str, Any]:
        if self._unavailable is not None or self._first is None:
            return unavailable(self._unavailable or "begin() was not called")
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._record(self._scrape())
        except Exception:  # noqa: BLE001
            self._failed += 1
        first, last = self._first, self._last
        assert last is not None
        latency = {}
        for name, hist in last.histograms.items():
            if not name.endswith("_seconds"):
                continue
            key = LATENCY_NAMES.get(name, name)
            if key in latency and key != name:  # an older alias of a name already read
                continue
            latency[key] = {"metric": name, **latency_delta(first.histograms.get(name), hist)}
        return {
            "available": True,
            "url": self.url,
            "interval_s": self.interval_s,
            "scrapes": self._scrapes,
            "failed_scrapes": self._failed,
            "series": dict(self._series),
            "counters": {
                name: value - first.counters.get(name, 0.0)
                for name, value in sorted(last.counters.items())
            },
            "latency": latency,
        }


def unavailable(reason: str) -> dict[str, Any]:
    """The record of a point whose server had no usable ``/metrics``."""
    return {"available": False, "reason": reason}
