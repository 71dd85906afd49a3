"""``serve.sla`` where the config enters: what its schema cannot say. Something is bounded,
each per-point entry names a point of the grid, no point is bounded on a metric its server
cannot report there (TPOT needs two output tokens), and the search's range is not empty. The
search itself is ``cellbench.serve.capacity`` (its meaning: ``cellbench.contracts.capacity``).
"""

from __future__ import annotations

from typing import Any

from cellbench.config.strict_yaml import ConfigError

KEY = "serve.sla"
BOUNDS = ("ttft_ms", "tpot_ms", "e2el_ms")


def check(config: dict[str, Any]) -> None:
    """Refuse an SLA that bounds nothing or cannot be searched, naming the key."""
    sla = config["serve"].get("sla")
    if sla is None:
        return
    from cellbench.contracts.capacity import point_bounds

    grid = [(g["isl"], g["osl"]) for g in config["serve"]["grid"]]
    seen: dict[tuple[int, int], int] = {}
    for i, entry in enumerate(sla["points"]):
        where = f"{KEY}.points[{i}] = {{isl: {entry['isl']}, osl: {entry['osl']}}}"
        ident = (entry["isl"], entry["osl"])
        if ident not in grid:
            known = ", ".join(f"{a}-{b}" for a, b in grid)
            raise ConfigError(f"config error: {where}: not a point of serve.grid ({known})")
        if ident in seen:
            raise ConfigError(
                f"config error: {where}: the same point as {KEY}.points[{seen[ident]}]"
            )
        seen[ident] = i
    bounded = {g: point_bounds(sla, *g) for g in grid}
    if not any(bounded.values()):
        raise ConfigError(
            f"config error: {KEY} bounds nothing: set ttft_ms, tpot_ms and/or e2el_ms (in ms), "
            "for every point or under points"
        )
    for (isl, osl), bounds in bounded.items():
        if "tpot" in bounds and osl < 2:
            raise ConfigError(
                f"config error: {KEY}.tpot_ms bounds grid point {isl}-{osl}, whose requests "
                "produce one output token: the server reports no TPOT there (null it under "
                "points, or bound ttft_ms / e2el_ms)"
            )
    if sla["max_concurrency"] < sla["start"]:
        raise ConfigError(
            f"config error: {KEY}.max_concurrency = {sla['max_concurrency']} is below "
            f"{KEY}.start = {sla['start']}: nothing to search"
        )
