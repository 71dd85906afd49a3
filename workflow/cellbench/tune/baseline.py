"""What each tuned entry is compared with: the config vLLM would use without the tuned file.

In-container module: stdlib + torch/triton through the backend (``kernels.config_lookup`` is
stdlib only).

Without a tuned file, vLLM takes the nearest entry of the file it ships for the shape, and
without one its default rule. So the baseline of batch size M is, in this order:

1. the table given with ``--seed-configs`` (the tuner was told what the image ships);
2. the file of the same name in the vLLM found where the tuner runs (inside the image on the
   docker runtime), looked up without importing vLLM;
3. vLLM's default rule (``kernels.config_lookup.default_config``).

Sources 1 and 2 are recorded as ``shipped`` (with the file they came from), 3 as ``default``.
The baseline and the tuned config are timed side by side, interleaved, with the same method and
repeats as the tuner's final, in the same process, so the two medians compare like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellbench.tune.kernels import config_lookup
from cellbench.tune.timing import time_side_by_side

__all__ = ["BaselineSource", "baseline_source", "baseline_config", "measure"]

SHIPPED, DEFAULT = "shipped", "default"


@dataclass(frozen=True)
class BaselineSource:
    """Where the baselines of one run come from: a table (shipped) or vLLM's default rule."""

    source: str
    table: dict[int, dict[str, int]] | None = None
    path: str | None = None


def baseline_source(
    config_file: str, seed_table: dict[int, dict[str, int]] | None, seed_path: str | None
) -> BaselineSource:
    """The seed table when given, else the shipped file of vLLM where this runs, else default."""
    if seed_table:
        return BaselineSource(SHIPPED, seed_table, seed_path)
    folder = config_lookup.vllm_configs_folder()
    if folder is not None:
        path = folder / config_file
        if path.is_file():
            table = config_lookup.read_table(path)
            return BaselineSource(SHIPPED, {m: dict(c) for m, c in table.items()}, str(path))
    return BaselineSource(DEFAULT)


def baseline_config(src: BaselineSource, m: int, shape: Any, rocm: bool) -> dict[str, int]:
    """The config vLLM would launch at batch size m without the tuned file."""
    if src.table is not None:
        return {k: int(v) for k, v in config_lookup.nearest_entry(src.table, m).items()}
    return config_lookup.default_config(
        m,
        shape.num_experts,
        shape.intermediate_size,
        shape.hidden_size,
        shape.topk,
        shape.dtype,
        shape.block_shape,
        rocm=rocm,
    )


def _same(a: dict[str, int], b: dict[str, int]) -> bool:
    """Equal as launched: a key absent on one side counts as equal only if absent on both."""
    return {k: int(v) for k, v in a.items()} == {k: int(v) for k, v in b.items()}


def measure(
    backend: Any,
    problems: list[Any],
    tuned: dict[str, int],
    src: BaselineSource,
    m: int,
    shape: Any,
    *,
    rocm: bool,
    on_gpu: bool,
    graph_calls: int,
    repeats: int,
) -> tuple[dict[str, Any], float | None]:
    """(baseline record, improvement_pct) for batch size m.

    The record: source, config, time_us (the baseline's median), tuned_time_us (the tuned
    config's median in the same side-by-side run), method, and path for a shipped table. When
    the baseline is the tuned config itself it is timed once and the improvement is 0. A
    baseline that fails to run (e.g. out of shared memory) is recorded with its error and no
    time; the improvement is then unknown (None)."""
    cfg = baseline_config(src, m, shape, rocm)
    rec: dict[str, Any] = {"source": src.source, "config": cfg}
    if src.path is not None:
        rec["path"] = src.path
    same = _same(cfg, tuned)
    rec["same_as_tuned"] = same
    configs = [tuned] if same else [tuned, cfg]
    try:
        timings = time_side_by_side(
            [[backend.call(p, c) for p in problems] for c in configs],
            on_gpu=on_gpu,
            graph_calls=graph_calls,
            repeats=repeats,
        )
    except Exception as e:  # noqa: BLE001 - a baseline that cannot run is recorded, not fatal
        rec.update(time_us=None, tuned_time_us=None, error=f"{type(e).__name__}: {e}"[:300])
        return rec, None
    t_tuned = timings[0]
    t_base = timings[-1]
    rec.update(
        time_us=t_base.median_us,
        tuned_time_us=t_tuned.median_us,
        method=t_tuned.method,
        repeats=repeats,
    )
    if same:
        return rec, 0.0
    return rec, 100.0 * (t_base.median_us - t_tuned.median_us) / t_base.median_us


def seed_path(given: str | None) -> str | None:
    """The --seed-configs path as given (absolute when it exists here)."""
    if given is None:
        return None
    p = Path(given)
    return str(p.resolve()) if p.exists() else given
