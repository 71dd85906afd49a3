"""The frames every renderer reads: checked stage results loaded into pandas tables.

The bottom of the report side: ``cellbench.report.build`` (report.md and the CSVs),
``plots``, ``pr_markdown`` and ``previous`` read their data through these functions and
nothing here imports them. Inputs go through ``cellbench.results.loaders``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cellbench.contracts import result_file, validity
from cellbench.contracts.point import point_figures
from cellbench.contracts.result_file import Result
from cellbench.results.loaders import load as load_result
from cellbench.stats import percentile_counts

ARM_LABELS = {"untuned": "Triton MoE Untuned", "tuned": "Triton MoE Tuned"}


# An untuned arm whose server loaded the image's own config for the shape is not untuned.
SHIPPED_LABEL = "Triton MoE Shipped config"


# How the report names the program that served an arm (served_by's server_program).
PROGRAM_NAMES = {"vllm": "vLLM", "transformers serve": "transformers serve"}


def arm_column(rows: pd.DataFrame, arm: str) -> str:
    """The column title of ``arm`` in a cell's tables: "shipped" where its server's log said
    it loaded the image's own config file (bench.json ``arm_label``); where the server's log
    showed no Triton MoE at all (``none seen``: e.g. vLLM's CPU backend), the arm is named by
    the program that ran it, not "Triton MoE"."""
    mine = rows[rows.arm == arm] if "arm" in rows else rows.iloc[0:0]
    if "arm_label" in rows and (mine.arm_label == "shipped").any():
        return SHIPPED_LABEL
    if "moe_source" in rows and len(mine) and (mine.moe_source == "none seen").all():
        programs = mine.server_program.dropna() if "server_program" in mine else []
        program = PROGRAM_NAMES.get(programs.iloc[0]) if len(programs) else None
        ran = f"{program}, no Triton MoE" if program else "no Triton MoE"
        return f"{arm.capitalize()} ({ran})"
    return ARM_LABELS[arm]


def arm_columns(serve: pd.DataFrame, cell: str) -> dict[str, str]:
    """Each arm's column title in ``cell``'s tables (``arm_column``), for tables without
    serve rows of their own (GSM8K); the plain labels where the cell has no serve results."""
    rows = serve[serve.cell == cell] if len(serve) and "cell" in serve else pd.DataFrame()
    return {arm: arm_column(rows, arm) if len(rows) else ARM_LABELS[arm] for arm in ARM_LABELS}


LATENCY_TABLES = (
    ("TTFT (ms)", "mean_ttft_ms"),
    ("TPOT (ms)", "mean_tpot_ms"),
    ("E2E Latency (ms)", "mean_e2el_ms"),
)


def served_by(bench: dict[str, Any]) -> dict[str, Any]:
    """What served an arm and on what, as its bench.json recorded them: the program named by
    the server's command line, the device its log (vLLM's engine line) or its command
    (``--device``) states, and the model's origin read from the model folder (null for files
    from before it was recorded, or a model the workflow did not build)."""
    command = [str(a) for a in (bench.get("server") or {}).get("command") or []]
    if "cellbench.serve.tf_serve" in command:
        program = "transformers serve"
    elif any("vllm" in a.rsplit("/", 1)[-1] for a in command):
        program = "vllm"
    else:
        program = "other" if command else None
    device = (bench.get("parallel_observed") or {}).get("device")
    if device is None and "--device" in command[:-1]:
        device = command[command.index("--device") + 1]
    origin = bench.get("model_origin") or {}
    said = ((bench.get("server") or {}).get("version") or {}).get("version")
    return {
        "server_program": program,
        # The version the running server gave for itself (GET /version); null where none.
        "server_version": said,
        "server_device": device,
        "model_built_by": origin.get("built_by"),
        "model_kind": origin.get("kind"),
    }


def _split_cell(cell_id: str) -> dict:
    image, model, layout = cell_id.split("/")
    tp, ep = layout.removeprefix("tp").split("-ep")
    return {"cell": cell_id, "image": image, "model": model, "tp": int(tp), "ep": int(ep)}


def load_inputs(files: Iterable[str | Path], results: str | Path = "results") -> list[Result]:
    """Every file checked through ``cellbench.results.loaders`` (schema, invariants, checksum); the
    first bad one raises ``ResultError`` naming it."""
    return [load_result(f, results) for f in files]


def comparison_frame(loaded: Iterable[Result]) -> pd.DataFrame:
    """Image comparisons (serve.compare_images) as one tidy frame: one row per point, tagged
    with its comparison, its image (side) and that side's digest."""
    rows = []
    for r in loaded:
        if r.kind != result_file.COMPARISON:
            continue
        data = r.data
        image_a, image_b = data["images"]
        _, model, layout = data["comparison"].split("/")
        tp, ep = layout.removeprefix("tp").split("-ep")
        for point in data["points"]:
            side = data["sides"][point["image"]]
            row = {
                "comparison": data["comparison"],
                "image_a": image_a,
                "image_b": image_b,
                "model": model,
                "tp": int(tp),
                "ep": int(ep),
                "arm": data["arm"],
                "image_digest": side.get("image_digest"),
                "cold": side.get("cold"),
                "same_environment": data["same_environment"],
            }
            row.update({k: v for k, v in point.items() if not isinstance(v, (list, dict))})
            # Tail percentiles only where their requests suffice, each metric's count beside.
            row.update(percentile_counts.published(point))
            row.update(_judged(point))
            row.update(point_figures(point))
            rows.append(row)
    return pd.DataFrame(rows)


def load_comparisons(files: Iterable[str | Path], results: str | Path = "results") -> pd.DataFrame:
    """The image comparisons among ``files``, checked, as ``comparison_frame``."""
    results = Path(results)
    chosen = [f for f in files if result_file.kind_of(f, results) == result_file.COMPARISON]
    return comparison_frame(load_inputs(chosen, results))


def _judged(point: dict[str, Any]) -> dict[str, str]:
    """``invalid`` for an older point whose summary shows a burst (validity.summary_reason),
    so no verdict rests on it; nothing for a point the serve stage judged itself."""
    reason = validity.summary_reason(point)
    return {"invalid": reason} if reason else {}


def cell_frames(loaded: Iterable[Result]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Checked stage results as three tidy frames: serve, gsm8k, tune (image comparisons are
    ``comparison_frame``'s). The cell comes from the file's own ``cell`` field for serve and
    GSM8K results (the loader checked it against the file's folder) and from the folder for
    tuning summaries, which do not record it."""
    serve_rows, gsm_rows, tune_rows = [], [], []
    for r in loaded:
        if r.kind == result_file.BENCH:
            serve_rows += _bench_rows(r.data)
        elif r.kind == result_file.GSM8K:
            gsm_rows.append(_gsm8k_row(r.data))
        elif r.kind == result_file.TUNE:
            tune_rows += _tune_rows(r.data, _split_cell("/".join(r.path.parts[-5:-2])))
    return pd.DataFrame(serve_rows), pd.DataFrame(gsm_rows), pd.DataFrame(tune_rows)


def _bench_rows(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """One serve row per point of an arm's bench.json."""
    cell = _split_cell(bench["cell"])
    rows = []
    for point in bench["points"]:
        row = {
            **cell,
            "arm": bench["arm"],
            "image_digest": bench.get("image_digest"),
            "cold": bench.get("cold"),
            # What the server was started with (the cell's tp/ep are the request).
            "tp_served": bench.get("tp"),
            "ep_served": bench.get("ep"),
            # What the server's log showed it used (moe_evidence), and the arm's name
            # for the report ("shipped": an untuned arm on the image's own config).
            "moe_source": (bench.get("moe_config") or {}).get("source"),
            "moe_paths": ", ".join((bench.get("moe_config") or {}).get("paths", [])),
            "arm_label": bench.get("arm_label", bench["arm"]),
        }
        row.update({k: v for k, v in point.items() if not isinstance(v, (list, dict))})
        row.update(percentile_counts.published(point))
        row.update(_judged(point))
        # The load label, goodput, /metrics and telemetry figures.
        row.update(point_figures(point))
        row["telemetry_how"] = _telemetry_how(point.get("telemetry") or {})
        # Renamed from gpus_shared_by_sides (files written before still say so).
        row["planned_gpu_overlap"] = bench.get(
            "planned_gpu_overlap", bench.get("gpus_shared_by_sides")
        )
        row.update(served_by(bench))
        rows.append(row)
    return rows


def _gsm8k_row(g: dict[str, Any]) -> dict[str, Any]:
    """The GSM8K row of an arm's gsm8k JSON."""
    return {
        **_split_cell(g["cell"]),
        "arm": g["arm"],
        "n_samples": g["n_samples"],
        "num_fewshot": g.get("num_fewshot"),
        "strict_match": g["strict_match"],
        "strict_match_stderr": g.get("strict_match_stderr"),
        "flexible_extract": g["flexible_extract"],
        "flexible_extract_stderr": g.get("flexible_extract_stderr"),
        "per_sample": json.dumps(g.get("per_sample", [])),
        # One entry per server start (gsm8k.instances); [] in older files.
        "instances": json.dumps(g.get("instances", [])),
        "api": g.get("api"),
    }


def _tune_rows(s: dict[str, Any], cell: dict[str, Any]) -> list[dict[str, Any]]:
    """One tune row per batch size of a tuning summary (its dict fields flattened a level)."""
    rows = []
    for m, entry in sorted(s.get("entries", {}).items(), key=lambda kv: int(kv[0])):
        row = {
            **cell,
            "batch_size": int(m),
            "device_name": s.get("device_name"),
            "backend": s.get("backend"),
            "mode": s.get("mode"),
            "interpreter": s.get("interpreter"),
            "config_file": s.get("config_file"),
            # what the run timed itself, and what it read back of an earlier log
            "candidates_timed": (s.get("counts") or {}).get("timed"),
            "new_kernels": (s.get("counts") or {}).get("new_kernels"),
            "resumed_log_records": s.get("resumed_log_records"),
            "log_set_aside": (s.get("log") or {}).get("set_aside_records"),
        }
        for k, v in entry.items():
            if isinstance(v, dict):
                row.update(
                    {f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, (dict, list))}
                )
            elif not isinstance(v, list):
                row[k] = v
        rows.append(row)
    return rows


def load_tables(
    files: Iterable[str | Path], results: str | Path = "results"
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Check and read stage outputs into three tidy frames: serve, gsm8k, tune."""
    return cell_frames(load_inputs(files, results))


def gsm8k_side(gsm: pd.DataFrame, **key: object) -> dict | None:
    """The GSM8K result of one cell and arm as ``comparison`` takes it (the result file's
    fields, ``per_sample`` decoded), or None when there is none."""
    if not len(gsm):
        return None
    mask = pd.Series(True, index=gsm.index)
    for k, v in key.items():
        mask &= gsm[k] == v
    if not mask.any():
        return None
    row = gsm[mask].iloc[0]
    return {
        "n_samples": int(row.n_samples),
        "strict_match": float(row.strict_match),
        "flexible_extract": float(row.flexible_extract),
        "per_sample": json.loads(row.per_sample),
    }


def select(frame: pd.DataFrame, **key: object) -> pd.DataFrame:
    """The rows of ``frame`` whose columns equal ``key``'s values."""
    mask = pd.Series(True, index=frame.index)
    for k, v in key.items():
        mask &= frame[k] == v
    return frame[mask]


def arms_cannot_differ(serve: pd.DataFrame, cell: str) -> bool:
    """Whether every server of both arms of ``cell`` said it ran no Triton fused-MoE (source
    ``none seen``): the tuned configs then reached no kernel, so a comparison means nothing."""
    if "moe_source" not in serve:
        return False
    sources = serve[(serve.cell == cell) & serve.arm.isin(["untuned", "tuned"])].moe_source
    return len(sources) > 0 and bool((sources == "none seen").all())


def median_spread(values: Iterable[float]) -> tuple[float, float | None]:
    """The median of ``values`` and half their interquartile range (None for one value)."""
    arr = np.asarray([float(v) for v in values], dtype=float)
    if arr.size == 0:
        return float("nan"), None
    median = float(np.median(arr))
    if arr.size == 1:
        return median, None
    q1, q3 = np.percentile(arr, [25, 75])
    return median, float(q3 - q1) / 2


def digest_of(serve, cell: str, fallback: str | None) -> str:
    if len(serve) and "image_digest" in serve:
        seen = sorted(set(serve[serve.cell == cell].image_digest.dropna()))
        if seen:
            return ", ".join(seen)
    return fallback or "n/a"


def _telemetry_how(record: dict) -> str | None:
    """How a point's energy was observed: vendor, GPUs, sampling interval, energy source."""
    if not record.get("available"):
        return None
    gpus = record.get("gpus") or []
    names = {"counter": "hardware energy counter", "power integral": "power samples' integral"}
    sources = sorted({names.get(g.get("energy_source"), "?") for g in gpus})
    indices = ",".join(str(g.get("index")) for g in gpus)
    return (
        f"{record.get('vendor')} GPU {indices} sampled every {record.get('interval_s')} s, "
        f"energy from the {' and '.join(sources)}"
    )
