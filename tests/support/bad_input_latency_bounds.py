"""The bad-input catalogue's latency-bound part (issue 32 item 5): report.latency_bounds values
the schema refuses and per-point entries that name no point that runs."""

from support.bad_input_probes import Probe, _set

LB = "report.latency_bounds"


def _bounds(**section):
    return _set("report", {"latency_bounds": section})


PROBES: list[Probe] = [
    Probe(
        "bounds-percentile-100",
        "config",
        f"`{LB}: {{percentile: 100, ttft_ms: 500}}`",
        f"{LB}.percentile = 100: 100 is greater than or equal to the maximum of 100",
        base="local",
        edit=_bounds(percentile=100, ttft_ms=500),
    ),
    Probe(
        "bounds-confidence-low",
        "config",
        f"`{LB}: {{confidence: 40, ttft_ms: 500}}`",
        f"{LB}.confidence = 40: 40 is less than the minimum of 50",
        base="local",
        edit=_bounds(confidence=40, ttft_ms=500),
    ),
    Probe(
        "bounds-zero-ms",
        "config",
        f"`{LB}: {{ttft_ms: 0}}`",
        f"{LB}.ttft_ms = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=_bounds(ttft_ms=0),
    ),
    Probe(
        "bounds-unknown-key",
        "config",
        f"`{LB}: {{p99_ttft_ms: 500}}`",
        f"unknown key 'p99_ttft_ms' in {LB}",
        base="local",
        edit=_bounds(p99_ttft_ms=500),
    ),
    Probe(
        "bounds-nothing",
        "config",
        f"`{LB}: {{percentile: 99}}` (no bound given)",
        f"{LB} bounds nothing: set ttft_ms and/or tpot_ms",
        base="local",
        edit=_bounds(percentile=99),
    ),
    Probe(
        "bounds-point-not-in-grid",
        "config",
        f"`{LB}.points: [{{isl: 512, osl: 512, ttft_ms: 900}}]` (not in the local grid)",
        f"{LB}.points[0] = {{isl: 512, osl: 512}}: not a point of serve.grid (32-8, 64-8)",
        base="local",
        edit=_bounds(ttft_ms=500, points=[{"isl": 512, "osl": 512, "ttft_ms": 900}]),
    ),
    Probe(
        "bounds-point-concurrency",
        "config",
        f"`{LB}.points: [{{isl: 32, osl: 8, concurrency: 16, ttft_ms: 900}}]`",
        f"{LB}.points[0].concurrency = 16: not one of serve.concurrency [2]",
        base="local",
        edit=_bounds(
            ttft_ms=500, points=[{"isl": 32, "osl": 8, "concurrency": 16, "ttft_ms": 900}]
        ),
    ),
    Probe(
        "bounds-point-no-bound",
        "config",
        f"`{LB}.points: [{{isl: 32, osl: 8}}]` (no bound in the entry)",
        f"{LB}.points[0] = {{isl: 32, osl: 8}}: sets no bound; give ttft_ms or tpot_ms",
        base="local",
        edit=_bounds(ttft_ms=500, points=[{"isl": 32, "osl": 8}]),
    ),
    Probe(
        "bounds-point-twice",
        "config",
        f"the same point twice in `{LB}.points`",
        f"{LB}.points[1] = {{isl: 32, osl: 8}}: the same point as {LB}.points[0]",
        base="local",
        edit=_bounds(ttft_ms=500, points=[{"isl": 32, "osl": 8, "ttft_ms": 900} for _ in "ab"]),
    ),
]
