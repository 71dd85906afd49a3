"""The bad-input catalogue's SLA part: serve.sla values that cannot define a capacity search
(no bound, a bound of zero or below, a percentile outside (0, 100), a metric the server does
not report), refused when the config loads with the key named."""

from support.bad_input_probes import Probe, _set

SLA = "serve.sla"


def _sla(**section):
    return _set("serve", "sla", section)


def _one_token_grid(cfg):
    cfg["serve"]["grid"] = [{"isl": 32, "osl": 1}]
    cfg["serve"]["sla"] = {"tpot_ms": 50}


PROBES: list[Probe] = [
    Probe(
        "sla-no-bound",
        "config",
        f"`{SLA}: {{percentile: 90}}` (no bound given)",
        f"{SLA} bounds nothing: set ttft_ms, tpot_ms and/or e2el_ms",
        base="local",
        edit=_sla(percentile=90),
    ),
    Probe(
        "sla-zero-bound",
        "config",
        f"`{SLA}: {{tpot_ms: 0}}`",
        f"{SLA}.tpot_ms = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=_sla(tpot_ms=0),
    ),
    Probe(
        "sla-negative-bound",
        "config",
        f"`{SLA}.points: [{{isl: 32, osl: 8, e2el_ms: -5}}]`",
        f"{SLA}.points[0].e2el_ms = -5: -5 is less than or equal to the minimum of 0",
        base="local",
        edit=_sla(points=[{"isl": 32, "osl": 8, "e2el_ms": -5}]),
    ),
    Probe(
        "sla-percentile-100",
        "config",
        f"`{SLA}: {{percentile: 100, ttft_ms: 500}}`",
        f"{SLA}.percentile = 100: 100 is greater than or equal to the maximum of 100",
        base="local",
        edit=_sla(percentile=100, ttft_ms=500),
    ),
    Probe(
        "sla-percentile-0",
        "config",
        f"`{SLA}: {{percentile: 0, ttft_ms: 500}}`",
        f"{SLA}.percentile = 0: 0 is less than or equal to the minimum of 0",
        base="local",
        edit=_sla(percentile=0, ttft_ms=500),
    ),
    Probe(
        "sla-unreported-metric",
        "config",
        f"`{SLA}: {{itl_ms: 20}}` (a bound on a metric the search does not measure)",
        f"unknown key 'itl_ms' in {SLA}",
        base="local",
        edit=_sla(itl_ms=20),
    ),
    Probe(
        "sla-tpot-one-token",
        "config",
        f"`{SLA}: {{tpot_ms: 50}}` with a grid point of one output token",
        f"{SLA}.tpot_ms bounds grid point 32-1, whose requests produce one output token: the "
        "server reports no TPOT there",
        base="local",
        edit=_one_token_grid,
    ),
    Probe(
        "sla-point-not-in-grid",
        "config",
        f"`{SLA}.points: [{{isl: 512, osl: 512, ttft_ms: 900}}]` (not in the local grid)",
        f"{SLA}.points[0] = {{isl: 512, osl: 512}}: not a point of serve.grid (32-8, 64-8)",
        base="local",
        edit=_sla(points=[{"isl": 512, "osl": 512, "ttft_ms": 900}]),
    ),
    Probe(
        "sla-max-below-start",
        "config",
        f"`{SLA}: {{ttft_ms: 500, start: 8, max_concurrency: 4}}`",
        f"{SLA}.max_concurrency = 4 is below {SLA}.start = 8",
        base="local",
        edit=_sla(ttft_ms=500, start=8, max_concurrency=4),
    ),
]
