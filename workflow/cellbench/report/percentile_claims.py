"""Percentile latency claims per cell, point and arm: where the config states
bounds (``report.latency_bounds``), whether each point's requests show the percentile of TTFT
and TPOT within the bound at the stated confidence, by MLPerf Inference's early-stopping rule
(``cellbench.stats.early_stopping``).

A point's queries are every measured request of that (ISL, OSL, load) and arm over all its
repeats, read from the per-request sidecar beside the arm's bench.json
(``cellbench.contracts.request_detail``, checked by ``results.loaders.load_requests``); a failed
request counts as over the bound. Each claim is ``yes`` (shown within the bound), ``no`` (shown
above it) or ``cannot tell`` (too few queries either way), with the queries the point would
need for the exceedances seen. Results written before the sidecar existed have no requests to
count: their rows say so instead of guessing from the summary's p99. An invalid repeat's
requests (``cellbench.contracts.validity``: a burst, a failed share past the limit) are left out of
the times, its failed requests still counted as over the bound, and the row says how many.

``claims_frame`` builds the table (``percentile_claims.csv``); ``section_lines`` renders one
cell's part of report.md and of the PR file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from cellbench.common import atomicio
from cellbench.contracts import load_shapes, request_detail, result_file, validity
from cellbench.contracts.point import BOUND_METRICS, point_bounds
from cellbench.contracts.result_file import Result, ResultError, rerun_hint
from cellbench.report.frames import ARM_LABELS
from cellbench.results.loaders import load_requests
from cellbench.stats import early_stopping as es

METRICS = tuple(zip(BOUND_METRICS, ("TTFT", "TPOT"), strict=True))
DEFAULTS = {"percentile": 99, "confidence": 99, "points": []}
CSV_NAME = "percentile_claims.csv"
NO_DETAIL = "no per-request detail"


def parse_bounds(text: str) -> dict[str, Any] | None:
    """``report.latency_bounds`` as the report job is given it (JSON; ``null``: none), with
    the schema's defaults; a ValueError names what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--latency-bounds is not JSON ({exc}): {text!r}") from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"--latency-bounds: a JSON object (report.latency_bounds), got {text!r}")
    bounds = {**DEFAULTS, **value}
    for key, low in (("percentile", 0), ("confidence", 50)):
        v = bounds[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v < 100 or v == 0:
            raise ValueError(f"--latency-bounds: {key} = {v!r}: a number of % in [{low}, 100)")
    for entry in [bounds, *bounds["points"]]:
        for metric, _ in METRICS:
            v = entry.get(metric)
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if v is not None and not (number and v > 0):
                raise ValueError(f"--latency-bounds: {metric} = {v!r}: a bound in ms, > 0")
    for entry in bounds["points"]:
        if not isinstance(entry.get("isl"), int) or not isinstance(entry.get("osl"), int):
            raise ValueError(f"--latency-bounds: points entry {entry!r} needs integer isl and osl")
    return bounds


def _detail_by_seq(result: Result) -> dict[int, dict] | None:
    """The arm's per-request records keyed by seq, each checked against its bench.json point;
    None when the arm has no sidecar (written before it was kept)."""
    path = result.path.with_name(request_detail.file_name())
    if not path.is_file():
        return None
    records = {rec["seq"]: rec for rec in load_requests(path)}
    rerun = rerun_hint(result.path, result_file.BENCH)
    points = {p["seq"]: p for p in result.data["points"]}
    if set(records) != set(points):
        expected = f"one record per point of {result.path} (seq {sorted(points)})"
        raise ResultError(path, "seq", sorted(records), expected, rerun)
    for seq, rec in records.items():
        sent = points[seq]["num_prompts"]
        if len(rec["errors"]) != sent:
            expected = f"one entry per prompt sent, num_prompts = {sent}"
            found = f"({len(rec['errors'])} requests)"
            raise ResultError(path, f"[seq {seq}].errors", found, expected, rerun)
    return records


def _groups(points: Iterable[Mapping]) -> dict[tuple, list[Mapping]]:
    """A bench.json's points by (isl, osl, load label), every repeat together."""
    out: dict[tuple, list[Mapping]] = {}
    for p in points:
        out.setdefault((p["isl"], p["osl"], load_shapes.point_label(p)), []).append(p)
    return out


def claims_frame(loaded: Iterable[Result], bounds: Mapping[str, Any] | None) -> pd.DataFrame:
    """One row per cell, arm, point and bounded metric: the bound, the observed percentile
    (of the successful requests), queries, failed, over, the verdict and the queries needed
    (empty for ``no``: the requests already show the percentile above the bound)."""
    if not bounds:
        return pd.DataFrame()
    bounds = {**DEFAULTS, **bounds}
    pct, conf = bounds["percentile"], bounds["confidence"]
    rows = []
    for r in loaded:
        if r.kind != result_file.BENCH:
            continue
        detail = _detail_by_seq(r)
        for (isl, osl, load), points in sorted(_groups(r.data["points"]).items(), key=str):
            shape = points[0].get("load_shape", load_shapes.CONCURRENCY)
            conc = points[0]["max_concurrency"] if shape == load_shapes.CONCURRENCY else None
            limits = point_bounds(bounds, isl, osl, conc)
            pooled: dict[str, list[float]] = {metric: [] for metric, _ in METRICS}
            failed = left_out = 0
            for p in points if detail is not None else ():
                lat = es.request_latencies_ms(detail[p["seq"]])
                failed += lat["failed"]
                if p.get("invalid") or validity.summary_reason(p):
                    # an invalid repeat's times measure no decoding; its failures still count
                    left_out += 1
                    continue
                for metric, _ in METRICS:
                    pooled[metric] += lat[metric]
            for metric, name in METRICS:
                bound = limits[metric]
                if bound is None:
                    continue
                row = {
                    "cell": r.data["cell"],
                    "arm": r.data["arm"],
                    "isl": isl,
                    "osl": osl,
                    "load": load,
                    "metric": name,
                    "percentile": pct,
                    "confidence": conf,
                    "bound_ms": float(bound),
                    "repeats": len(points),
                }
                if detail is None:
                    rows.append({**row, "verdict": es.CANNOT_TELL, "note": NO_DETAIL})
                    continue
                values = pooled[metric]
                c = es.claim(
                    values, bound, failed=failed, percentile=pct / 100, confidence=conf / 100
                )
                verdict = es.verdict(c["queries"], c["over"], pct / 100, conf / 100)
                rows.append(
                    {
                        **row,
                        "observed_ms": float(np.percentile(values, pct)) if values else math.nan,
                        "queries": c["queries"],
                        "failed": failed,
                        "over": c["over"],
                        "verdict": verdict,
                        "queries_needed": None if verdict == es.NOT_MET else c["queries_needed"],
                        "note": _left_out_note(left_out),
                    }
                )
    frame = pd.DataFrame(rows)
    for col in ("queries", "failed", "over", "queries_needed"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame


def _left_out_note(left_out: int) -> str:
    if not left_out:
        return ""
    return (
        f"{left_out} invalid repeat{'s' if left_out > 1 else ''} left out, "
        "their failed requests still counted"
    )


def index_entries(loaded: Iterable[Result], bounds: Mapping[str, Any] | None) -> list[dict]:
    """The per-request files the claims were read from, as report INDEX.json lists its inputs
    (path, kind, sha256, whether a recorded checksum vouched for it)."""
    out = []
    for r in loaded if bounds else ():
        path = r.path.with_name(request_detail.file_name())
        if r.kind == result_file.BENCH and path.is_file():
            # Claims came from load_requests, which refuses a file without its checksum.
            out.append({
                "path": str(path),
                "kind": "requests",
                "sha256": atomicio.sha256_file(path),
                "checksum": result_file.VERIFIED,
            })  # fmt: skip
    return out


def _num(value: Any, digits: int = 0) -> str:
    if value is None or pd.isna(value):
        return "n/a"
    return f"{value:.{digits}f}"


def section_lines(
    claims: pd.DataFrame | None,
    cell: str,
    heading: str = "####",
    labels: dict[str, str] | None = None,
) -> list[str]:
    """One cell's claims as a Markdown table with the rule that decides them; nothing when no
    bound was set or the cell has no serve results. ``labels``: each arm's name in the cell's
    tables (``frames.arm_columns``)."""
    labels = labels or ARM_LABELS
    if claims is None or not len(claims) or not (claims.cell == cell).any():
        return []
    rows = claims[claims.cell == cell]
    pct, conf = rows.percentile.iloc[0], rows.confidence.iloc[0]
    need0 = es.queries_needed(0, pct / 100, conf / 100)
    need1 = es.queries_needed(1, pct / 100, conf / 100)
    label = f"p{pct:g}"
    out = [
        f"{heading} Latency bounds: {label} at {conf:g}% confidence",
        "",
        f"Per point and arm, every measured request of its repeats pooled; a failed request "
        f"counts as over the bound. *Met*: **yes** when the requests show the {label} within "
        f"the bound at {conf:g}% confidence by MLPerf Inference's early-stopping rule (here "
        f"{need0} queries with none over, {need1} with one), **no** when they show it above "
        "the bound, else **cannot tell**. *Queries needed*: the fewest queries with which the "
        f"exceedances seen would still meet the bound. The observed {label} is of the "
        "successful requests.",
        "",
        f"| ISL-OSL | load | arm | metric | bound (ms) | observed {label} (ms) | queries | over "
        "| met | queries needed |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    arm_order = {arm: i for i, arm in enumerate(ARM_LABELS)}
    metric_order = {name: i for i, (_, name) in enumerate(METRICS)}
    rows = rows.assign(_a=rows.arm.map(arm_order), _m=rows.metric.map(metric_order))
    rows = rows.sort_values(["isl", "osl", "load", "_a", "_m"])
    for r in rows.itertuples():
        if r.note == NO_DETAIL:
            tail = f"n/a | n/a | n/a | {r.verdict} ({NO_DETAIL}: rerun its serve job) | n/a"
        else:
            verdict = f"{r.verdict} ({r.note})" if r.note else r.verdict
            tail = (
                f"{_num(r.observed_ms, 2)} | {_num(r.queries)} | {_num(r.over)} | "
                f"{verdict} | {_num(r.queries_needed) if r.verdict != es.NOT_MET else '-'}"
            )
        arm = labels.get(r.arm, r.arm)
        out.append(f"| {r.isl}-{r.osl} | {r.load} | {arm} | {r.metric} | {r.bound_ms:g} | {tail} |")
    return [*out, ""]
