"""Figures of the any-list tuner runs (benchmarks/tuner_any_list.py), for render_figures.py.

Each family reads the runs and side-by-side re-times a device call wrote into a results
folder (`runs_CALL.json`, `retime_CALL.json`); FOLDER is relative to benchmarks/results/.
Default's pick over the reference at a size is computed inside one re-time (one process),
never across calls.
"""

from __future__ import annotations

import json
from typing import Any

from figure_sources import Sources


def _retime(src: Sources, folder: str, call: str, dtype: str) -> dict[str, Any]:
    return json.loads(src.text(f"{folder}/retime_{call}.json"))["retime"][dtype]


def _ratios(rt: dict[str, Any], name: str, against: str) -> dict[int, float]:
    """Size -> default's pick of list `name` over the reference (`exh`: exhaustive's, measured
    or recorded; `ship`: vLLM's shipped config), where both were re-timed."""
    out = {}
    for m, labels in rt["labels"].items():
        timed = rt["timed"].get(m, {})
        key = labels.get(f"default:{name}")
        ref = labels.get("shipped") if against == "ship" else (
            labels.get("exhaustive") or labels.get("exhaustive-recorded"))  # fmt: skip
        d = timed.get(key, {}).get("call_us") if key else None
        r = timed.get(ref, {}).get("call_us") if ref else None
        if d and r:
            out[int(m)] = d / r
    return out


def ratio_range(src: Sources, folder: str, call: str, dtype: str, name: str, against: str) -> str:
    """'LOW-HIGH' of default's pick over the reference at the sizes of one list."""
    got = _ratios(_retime(src, folder, call, dtype), name, against)
    if not got:
        raise LookupError(f"{folder}/retime_{call}.json: no {dtype} {name} ratio vs {against}")
    return f"{min(got.values()):.3f}-{max(got.values()):.3f}"


def ratio_at(src: Sources, folder: str, call: str, dtype: str, name: str, against: str,
             m: str) -> str:  # fmt: skip
    """Default's pick over the reference at one size of one list."""
    got = _ratios(_retime(src, folder, call, dtype), name, against)
    if int(m) not in got:
        raise LookupError(f"{folder}/retime_{call}.json: no {dtype} {name} M={m} vs {against}")
    return f"{got[int(m)]:.3f}"


def process_walls(src: Sources, folder: str, dtype: str, default_call: str, exh_calls: str,
                  once: str = "") -> str:  # fmt: skip
    """Default's process wall over the standard sizes over exhaustive's (its parts in the calls
    of `exh_calls`, '+' between them, summed); with `once`, every part after the first less
    its time outside the per-size tuning (start-up counted once, as on default's side)."""
    runs = json.loads(src.text(f"{folder}/runs_{default_call}.json"))["runs"]
    d = runs[f"{dtype}-default-standard18"]["wall_outer_s"]
    parts = []
    for call in exh_calls.split("+"):
        for tag, r in json.loads(src.text(f"{folder}/runs_{call}.json"))["runs"].items():
            if tag.startswith(f"{dtype}-exhaustive-standard18") and "wall_outer_s" in r:
                parts.append(r)
    exh = sum(p["wall_outer_s"] for p in parts)
    if once:
        exh -= sum(p["wall_outer_s"] - sum(e["tune_wall_s"] for e in p["entries"].values())
                   for p in parts[1:])  # fmt: skip
    return f"{d / exh:.3f}"


FAMILIES = {
    "any-list-range": ratio_range,
    "any-list-at": ratio_at,
    "any-list-walls": process_walls,
}
