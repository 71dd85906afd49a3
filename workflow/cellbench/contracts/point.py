"""What a measured point is to every reader: its identity across repeats and sides
(``point_key``), the figures observed around it as the report's tables show them
(``point_figures``), and the latency bounds the config sets on it (``point_bounds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cellbench.contracts import load_shapes

PointKey = tuple[int, int, str]
# The metrics report.latency_bounds may bound, in ms.
BOUND_METRICS = ("ttft_ms", "tpot_ms")


def point_key(point: Mapping[str, Any]) -> PointKey:
    """A grid point's identity across repeats and sides: ISL, OSL and its load label."""
    return (int(point["isl"]), int(point["osl"]), load_shapes.point_label(point))


def point_figures(point: dict[str, Any]) -> dict[str, Any]:
    """The tidy-frame columns of what was observed around a point (one row per point):
    its load label (``c16``, ``2 req/s``), goodput, the server's own latencies and peak queue
    from ``/metrics`` (NaN where it had none), and GPU energy and power (NaN where no
    telemetry). Older bench.json files, without these fields, get the label and NaNs."""
    nan = float("nan")
    out: dict[str, Any] = {"load": load_shapes.point_label(point)}
    metrics = point.get("server_metrics") or {}
    latency = metrics.get("latency", {}) if metrics.get("available") else {}
    for name in ("ttft", "itl", "e2el"):
        value = latency.get(name, {}).get("mean_ms")
        out[f"server_mean_{name}_ms"] = nan if value is None else value
    series = metrics.get("series", {}) if metrics.get("available") else {}
    for column, gauge in (
        ("server_max_running", "vllm:num_requests_running"),
        ("server_max_waiting", "vllm:num_requests_waiting"),
        ("server_max_kv_cache_usage", "vllm:kv_cache_usage_perc"),
    ):
        values = [v for _, v in series.get(gauge, [])]
        out[column] = max(values) if values else nan
    tele = point.get("telemetry") or {}
    for column in ("energy_j", "mean_power_w", "joules_per_output_token"):
        value = tele.get(column) if tele.get("available") else None
        out[column] = nan if value is None else value
    return out


def point_bounds(
    bounds: Mapping[str, Any], isl: int, osl: int, concurrency: int | None = None
) -> dict[str, float | None]:
    """Each metric's bound in ms at one point under ``report.latency_bounds`` (None:
    unbounded there): the section's, replaced by a ``points`` entry for (isl, osl), then by
    one that also names ``concurrency`` (a request-rate point, ``concurrency`` None, takes
    only the former)."""
    out = {metric: bounds.get(metric) for metric in BOUND_METRICS}
    here = [e for e in bounds.get("points", []) if (e["isl"], e["osl"]) == (isl, osl)]
    general = [e for e in here if e.get("concurrency") is None]
    specific = [e for e in here if concurrency is not None and e.get("concurrency") == concurrency]
    for entry in general + specific:
        out.update({metric: entry[metric] for metric in BOUND_METRICS if metric in entry})
    return out
