"""``report.latency_bounds`` where the config enters: the checks a schema cannot make (each
per-point entry names a point that runs, something is bounded) and the plan's warnings for
points whose prompts cannot support the percentile claim. The report side
is ``cellbench.report.percentile_claims``; the statistics ``cellbench.stats.early_stopping``.
"""

from __future__ import annotations

from typing import Any

from cellbench.config.strict_yaml import ConfigError


def check(config: dict[str, Any]) -> None:
    """report.latency_bounds: something bounded, and each per-point entry a point that runs."""
    bounds = config["report"].get("latency_bounds")
    if bounds is None:
        return
    key, metrics = "report.latency_bounds", ("ttft_ms", "tpot_ms")
    grid = [(g["isl"], g["osl"]) for g in config["serve"]["grid"]]
    conc, seen = config["serve"]["concurrency"], {}
    for i, entry in enumerate(bounds["points"]):
        where = f"{key}.points[{i}] = {{isl: {entry['isl']}, osl: {entry['osl']}}}"
        if (entry["isl"], entry["osl"]) not in grid:
            known = ", ".join(f"{a}-{b}" for a, b in grid)
            raise ConfigError(f"config error: {where}: not a point of serve.grid ({known})")
        if entry.get("concurrency", conc[0]) not in conc:
            raise ConfigError(
                f"config error: {key}.points[{i}].concurrency = {entry['concurrency']}: not one "
                f"of serve.concurrency {conc}"
            )
        if not any(m in entry for m in metrics):
            raise ConfigError(
                f"config error: {where}: sets no bound; give ttft_ms or tpot_ms (null leaves "
                "that metric unbounded at the point)"
            )
        ident = (entry["isl"], entry["osl"], entry.get("concurrency"))
        if ident in seen:
            raise ConfigError(
                f"config error: {where}: the same point as {key}.points[{seen[ident]}]"
            )
        seen[ident] = i
    if not any(bounds.get(m) for m in metrics) and not any(
        e.get(m) for e in bounds["points"] for m in metrics
    ):
        raise ConfigError(
            f"config error: {key} bounds nothing: set ttft_ms and/or tpot_ms (in ms), for "
            "every point or under points"
        )


def plan_warnings(config: dict[str, Any]) -> list[str]:
    """Per bounded point and load, a warning when its prompts over all repeats (the queries the
    report pools) cannot support the percentile claim even with none over the bound."""
    # Here, not at the top: the loader imports this module, and these bring numpy and scipy.
    from cellbench.contracts.point import point_bounds
    from cellbench.stats.early_stopping import plan_warning

    bounds = config["report"].get("latency_bounds")
    if not bounds:
        return []
    serve = config["serve"]
    # a point pools its repeats over all its server starts, at most the cap's: the best case
    span = serve.get("starts") or {"min": 1, "cap": 1}
    repeats = int(serve["repeats"]) * int(span["cap"])
    loads = [(f"c{c}", c, serve["prompts_per_concurrency"] * c) for c in serve["concurrency"]]
    loads += [(f"{r:g} req/s", None, serve["request_rate_prompts"]) for r in serve["request_rates"]]
    out = []
    for g in serve["grid"]:
        for label, conc, prompts in loads:
            limits = point_bounds(bounds, g["isl"], g["osl"], conc)
            bounded = [m for m, v in limits.items() if v is not None]
            if not bounded:
                continue
            why = plan_warning(
                prompts * repeats, bounds["percentile"] / 100, bounds["confidence"] / 100
            )
            if why:
                out.append(
                    f"report.latency_bounds at {g['isl']}-{g['osl']} {label} "
                    f"({', '.join(bounded)}), {prompts} prompts x {repeats} repeats pooled"
                    f"{_starts_note(serve, span)}: {why}"
                )
    return out


def _starts_note(serve: dict, span: dict) -> str:
    """How the pooled repeats come about when a point takes several server starts."""
    if int(span["cap"]) <= 1:
        return ""
    return f" ({serve['repeats']} a start x {span['cap']} starts, the cap)"
