"""Load shapes of the serve grid and goodput under SLOs, with ``vllm bench serve``'s meanings.

* Fixed concurrency (the anchors): ``max_concurrency`` requests in flight, all sent at once.
* Request rate: requests arrive at ``request_rate`` per second; the gaps between arrivals are
  gamma-distributed with shape ``burstiness`` and mean ``1 / request_rate`` (vLLM's
  ``--request-rate`` and ``--burstiness``): burstiness 1 is a Poisson process, below 1 is
  burstier, above 1 more even, and ``inf`` is a constant gap. The first request goes at 0.
* Goodput (vLLM's ``--goodput ttft:MS tpot:MS e2el:MS``): completed requests per second whose
  every named latency is at or under its threshold in ms; a request of one output token has
  TPOT 0 for this test, as in vLLM.

``load_points`` lists one job's points per grid point: the concurrency points first, then the
request-rate points, so both kinds run in the same interleaved-arms order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

SLO_NAMES = ("ttft", "tpot", "e2el")
CONCURRENCY = "concurrency"
REQUEST_RATE = "request_rate"


def arrival_offsets(
    n: int, request_rate: float, burstiness: float, rng: np.random.Generator
) -> list[float]:
    """Send times (s after the point's start) of ``n`` requests: all 0 at an infinite rate."""
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 or inf, got {burstiness}")
    if request_rate == math.inf:
        return [0.0] * n
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 or inf, got {request_rate}")
    if burstiness == math.inf:
        gaps = np.full(n, 1.0 / request_rate)
    else:
        # Mean gap shape * scale = 1 / rate whatever the shape.
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    if n:
        gaps[0] = 0.0
    return [float(x) for x in np.cumsum(gaps)]


def parse_goodput(spec: Mapping[str, Any] | Iterable[str] | None, where: str) -> dict[str, float]:
    """SLO thresholds in ms from a mapping ``{ttft: 500}`` or vLLM's ``["ttft:500", ...]``;
    ValueError naming ``where``, the bad entry and what is expected."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        pairs = list(spec.items())
    else:
        pairs = []
        for item in spec:
            name, sep, value = str(item).partition(":")
            if not sep:
                raise ValueError(f"{where}: {item!r} is not NAME:MS (e.g. ttft:500)")
            pairs.append((name, value))
    out: dict[str, float] = {}
    for name, value in pairs:
        if name not in SLO_NAMES:
            raise ValueError(
                f"{where}: unknown SLO {name!r}; expected one of {', '.join(SLO_NAMES)}"
            )
        try:
            ms = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}.{name}: {value!r} is not a number of ms") from None
        if isinstance(value, bool) or not ms >= 0 or ms == math.inf:
            raise ValueError(f"{where}.{name}: {value!r} must be a finite number of ms >= 0")
        out[name] = ms
    return out


def request_tpot_s(latency: float, ttft: float, output_len: int) -> float:
    """One request's TPOT in s; 0 for a single output token (vLLM's rule for goodput)."""
    return (latency - ttft) / (output_len - 1) if output_len > 1 else 0.0


def goodput(
    ttfts: list[float],
    latencies: list[float],
    output_lens: list[int],
    errors: list[str],
    duration: float,
    slos_ms: Mapping[str, float],
) -> dict[str, Any]:
    """Good requests and goodput (req/s) from per-request data (seconds; '' = no error)."""
    good = 0
    for ttft, latency, n_out, err in zip(ttfts, latencies, output_lens, errors, strict=True):
        if err:
            continue
        observed = {
            "ttft": ttft * 1000.0,
            "tpot": request_tpot_s(latency, ttft, n_out) * 1000.0,
            "e2el": latency * 1000.0,
        }
        if all(observed[name] <= limit for name, limit in slos_ms.items()):
            good += 1
    return {
        "slo_ms": dict(slos_ms),
        "good_requests": good,
        "request_goodput": good / duration if duration > 0 else 0.0,
    }


def load_points(
    concurrency: list[int],
    request_rate: float,
    request_rates: list[float],
    burstiness: float,
    prompts_per_concurrency: int,
    warmups_per_concurrency: int,
    request_rate_prompts: int,
) -> list[dict[str, Any]]:
    """The load points of one grid point, in the order they run.

    A request-rate point caps nothing: its ``max_concurrency`` is its prompt count (every
    request may be in flight), as vLLM leaves concurrency unbounded without
    ``--max-concurrency``. Its warm-ups are ``warmups_per_concurrency`` requests sent at once.
    """
    points = [
        {
            "load_shape": CONCURRENCY,
            "max_concurrency": conc,
            "num_prompts": prompts_per_concurrency * conc,
            "num_warmups": warmups_per_concurrency * conc,
            "request_rate": request_rate,
            "burstiness": burstiness,
        }
        for conc in concurrency
    ]
    points += [
        {
            "load_shape": REQUEST_RATE,
            "max_concurrency": request_rate_prompts,
            "num_prompts": request_rate_prompts,
            "num_warmups": warmups_per_concurrency,
            "request_rate": rate,
            "burstiness": burstiness,
        }
        for rate in request_rates
    ]
    return points


def point_label(point: Mapping[str, Any]) -> str:
    """How tables name a point's load: ``c16``, or ``2 req/s`` (with its burstiness when not
    Poisson)."""
    if point.get("load_shape", CONCURRENCY) == CONCURRENCY:
        return f"c{point['max_concurrency']}"
    rate = point["request_rate"]
    label = f"{rate:g} req/s"
    b = point.get("burstiness", 1.0)
    if b in ("inf", math.inf):
        return label + " const"
    return label if b == 1.0 else f"{label} b{b:g}"
