"""One measured point with everything observed around it: the load generator's figures, the
server's ``/metrics`` (server_metrics), GPU telemetry (telemetry), goodput under the SLOs
(load_shapes) and every request's data (request_detail).

The serve stage calls ``run`` once per point; the probes see only the measured requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cellbench.contracts import load_shapes, request_detail
from cellbench.serve import loadgen, server_metrics, telemetry


@dataclass(frozen=True)
class Observation:
    """What to observe around each point, and how often."""

    metrics_interval_s: float = server_metrics.DEFAULT_INTERVAL_S
    telemetry_interval_s: float = telemetry.DEFAULT_INTERVAL_S
    gpu_vendor: str = "none"
    goodput_ms: dict[str, float] = field(default_factory=dict)  # SLO name -> threshold, ms


def run(
    base_url: str,
    model_id: str,
    tok: Any,
    spec: loadgen.PointSpec,
    *,
    load_shape: str,
    ignore_eos: bool,
    backend: str,
    gpu_indices: tuple[int, ...],
    observe: Observation,
) -> tuple[dict[str, Any], dict[str, list]]:
    """Run one point; return its bench.json entry and its per-request lists."""
    scraper = server_metrics.MetricsScraper(base_url, observe.metrics_interval_s)
    sampler = telemetry.GpuSampler(observe.gpu_vendor, gpu_indices, observe.telemetry_interval_s)
    pt = loadgen.run_point(
        base_url,
        model_id,
        tok,
        spec,
        ignore_eos=ignore_eos,
        backend=backend,
        keep_results=True,
        probes=(scraper, sampler),
    )
    results = pt.pop("_results")
    detail = request_detail.detail_of(results, tok)
    pt["load_shape"] = load_shape
    # vLLM's key: null when no SLO was set, as vllm bench serve saves it.
    pt["request_goodput"] = None
    if observe.goodput_ms:
        good = load_shapes.goodput(
            detail["ttfts"],
            detail["latencies"],
            detail["output_lens"],
            detail["errors"],
            pt["duration"],
            observe.goodput_ms,
        )
        pt["request_goodput"] = good["request_goodput"]
        pt["goodput"] = good
    pt["server_metrics"] = scraper.record
    pt["telemetry"] = telemetry.with_tokens(sampler.record, pt["total_output_tokens"])
    return pt, detail
