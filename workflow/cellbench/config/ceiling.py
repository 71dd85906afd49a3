"""The plan's ceiling: a config that `cellbench plan` prices above plan.max_gpu_hours or
plan.max_hours is refused before any job, unless plan.allow_over_ceiling says to run it.

Where the workflow (common.smk) and `cellbench cells` read the config, it is priced by the
plan's assumptions alone (no results folder read, so the verdict depends on the config only);
the workflow's start checks again with the estimate it prints, which uses each cell's history
where there is one. Not in the loader: the estimate imports the loader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cellbench.config.strict_yaml import ConfigError

NO_HISTORY = Path(os.devnull) / "no-history"  # below a file: never a folder, so no history


def check(config: dict[str, Any], est: dict[str, Any]) -> None:
    """Refuse ``est`` (a cost.estimate of ``config``) above the plan's ceilings."""
    plan = config["plan"]
    if plan.get("allow_over_ceiling"):
        return
    gpu_h = sum(t["gpu_hours"] for t in est["totals"].values())
    hours = sum(t["seconds"] for t in est["totals"].values()) / 3600
    over = []
    if gpu_h > plan["max_gpu_hours"]:
        over.append(f"{gpu_h:.4g} GPU-hours (plan.max_gpu_hours = {plan['max_gpu_hours']:g})")
    if hours > plan["max_hours"]:
        over.append(
            f"{hours:.4g} hours of jobs one after another (plan.max_hours = {plan['max_hours']:g})"
        )
    if not over:
        return
    cell, kind, job = max(
        ((c, k, j) for c, jobs in est["cells"].items() for k, j in jobs.items()),
        key=lambda x: x[2]["seconds"] * max(x[2]["gpus"], 1),
    )
    raise ConfigError(
        f"config error: the plan prices this run at {' and '.join(over)}; the largest job is "
        f"{kind} of {cell} at {job['seconds'] / 3600:.4g} hours ({job['basis']}). Expected a "
        "run within the ceilings: make it smaller, raise the ceiling, or set "
        "plan.allow_over_ceiling: true to run it anyway (`cellbench plan` shows every job)"
    )


def check_config(config: dict[str, Any]) -> None:
    """The ceiling on the plan's assumption-only price of ``config``."""
    if config["plan"].get("allow_over_ceiling"):
        return
    from cellbench.config import cost  # imports the loader: not at this module's top

    check(config, cost.estimate(config, NO_HISTORY, NO_HISTORY))
