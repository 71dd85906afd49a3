"""Tuned configs gathered per ROCm version and device, ready for vLLM and for a pull request.

Every cell's tune job leaves vLLM's JSON (``tune/configs/<name>.json``) and AITER-style rows
(``tune/tuned_fmoe.csv``). This module gathers the cells of one archive label (the image's ROCm
version, or the run label of the local runtime) into

    results/configs/{label}/{device_name}/<vLLM file name>.json    (only these at the top level)
    results/configs/{label}/{device_name}/cellbench/MANIFEST.json
    results/configs/{label}/{device_name}/cellbench/tuned_fmoe.csv
    results/configs/{label}/INDEX.json                             (written last: the output)

so ``VLLM_TUNED_CONFIG_FOLDER=results/configs/{label}/{device_name}`` works as it is (vLLM and
``kernels.config_lookup`` open ``<folder>/<exact file name>`` and nothing else), and the JSON
files drop into vLLM's ``fused_moe/configs/`` unchanged: with ``tune.keep: all`` they are the
cells' files byte for byte.

Each entry (file, batch size M) records the cells that produced it, the gain over the baseline
their tuner measured (``improvement_pct``: vLLM's shipped or default config, timed side by side)
and whether that gain reached ``tune.min_improvement_pct``. ``tune.keep: improved`` writes only
entries that reached it in every cell that produced them; a file left without entries is not
written, and the manifest says why. Summaries from before the tuner measured a baseline have no
gain: their entries count as not improved.

Two cells that produce one file name with different content is an error naming both cells and
the differing keys (batch size and field), raised before anything is written. The same content
from two cells is one file with both cells recorded.

    python -m cellbench.configs --label rocm7.2 --results results --cells CELL... \
        --images-json JSON --keep all --min-improvement-pct 3 --out-dir results/configs/rocm7.2
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio, paths
from cellbench.common.atomicio import sha256_file
from cellbench.common.gitstate import git_state
from cellbench.contracts import result_file
from cellbench.results import loaders
from cellbench.tune.artifacts import AITER_COLUMNS, vllm_config_json

__all__ = [
    "ConfigCollision",
    "ConfigsError",
    "KEEP_CHOICES",
    "gather",
    "image_facts",
    "write",
    "main",
]

KEEP_CHOICES = ("all", "improved")
META_DIR = "cellbench"  # beside the JSON files, where vLLM's lookup never looks
MANIFEST_NAME = "MANIFEST.json"
CSV_NAME = "tuned_fmoe.csv"
INDEX_NAME = "INDEX.json"
SCHEMA_VERSION = 1
# AITER's key of a tuned row: the shape and types (a second row with it is AITER's collision).
AITER_KEY = (
    "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,"
    "use_g1u1,doweight_stage1"
).split(",")


class ConfigsError(ValueError):
    """Bad input to the gather (a missing or bad cell result, a bad option)."""


class ConfigCollision(ConfigsError):
    """Two cells produced one vLLM file name with different content."""


@dataclass
class CellTune:
    """One cell's tune outputs, checked through cellbench.results.loaders."""

    cell: str
    image: str
    summary: dict[str, Any]
    summary_sha256: str
    config_file: str
    config_bytes: bytes
    table: dict[str, Any]  # the vLLM JSON as read (triton_version included)
    csv_rows: list[dict[str, str]] | None  # None: the cell wrote no CSV


@dataclass
class ConfigFile:
    """One vLLM file name of one device, and the cells that produced it (same content)."""

    name: str
    cells: list[CellTune] = field(default_factory=list)


def image_facts(config: dict[str, Any], pins: Any, images: list[str]) -> dict[str, Any]:
    """Per image: the pinned digest (or host environment) and the ROCm version, saying where
    the version was read: the lock (what `cellbench images lock` found in the image), else the
    config's ``rocm_version`` (declared, not read), else none (local runtime)."""
    lock: dict[str, Any] = {}
    if config["runtime"] == "docker" and Path(config["image_lock"]).exists():
        from cellbench.runtime import images as images_mod

        lock = images_mod.load_lock(config["image_lock"]).get("images", {})
    out = {}
    for image in sorted(set(images)):
        found = (lock.get(image) or {}).get("rocm_version")
        declared = config["images"][image].get("rocm_version")
        if found:
            version, source = str(found), "lock (read from the image when pinned)"
        elif declared:
            version, source = str(declared), "config (images.*.rocm_version, declared)"
        else:
            version, source = None, "none (no ROCm version for this runtime)"
        out[image] = {
            "digest": pins.digest(image),
            "rocm_version": version,
            "rocm_version_source": source,
        }
    return out


def _read_csv(path: Path) -> list[dict[str, str]] | None:
    if not path.exists():
        return None
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _load_cell(results: Path, cell: str) -> CellTune:
    tune = results / cell / "tune"
    try:
        summary = loaders.load_tune(tune / "summary.json", results)
        cfg_path = tune / "configs" / summary.data["config_file"]
        config = loaders.load_vllm_config(cfg_path, results)
    except result_file.ResultError as exc:
        raise ConfigsError(f"cell {cell}: {exc}") from None
    return CellTune(
        cell=cell,
        image=cell.split("/", 1)[0],
        summary=summary.data,
        summary_sha256=summary.sha256,
        config_file=summary.data["config_file"],
        config_bytes=cfg_path.read_bytes(),
        table=config.data,
        csv_rows=_read_csv(tune / CSV_NAME),
    )


def _differences(a: CellTune, b: CellTune) -> list[str]:
    """The keys where two cells' files differ: 'M=16 BLOCK_SIZE_N: 64 vs 32', ..."""
    out = []
    ta, tb = a.table, b.table
    if ta.get("triton_version") != tb.get("triton_version"):
        out.append(f"triton_version: {ta.get('triton_version')} vs {tb.get('triton_version')}")
    sizes = sorted({int(k) for k in (*ta, *tb) if k != "triton_version"})
    for m in sizes:
        ea, eb = ta.get(str(m)), tb.get(str(m))
        if ea is None or eb is None:
            out.append(f"M={m}: only in {a.cell if eb is None else b.cell}")
            continue
        for key in sorted(set(ea) | set(eb)):
            if ea.get(key) != eb.get(key):
                out.append(f"M={m} {key}: {ea.get(key, '(absent)')} vs {eb.get(key, '(absent)')}")
    if not out and a.config_bytes != b.config_bytes:
        out.append("(same configs, different bytes: key order or formatting)")
    return out


def gather(results: Path, cells: list[str]) -> dict[str, dict[str, ConfigFile]]:
    """device_name -> vLLM file name -> the cells that produced it. Raises ConfigCollision
    (both cells, the differing keys) when two cells produced one name differently."""
    if not cells:
        raise ConfigsError("no cells given: expected at least one CELL (image/model/tpN-epM)")
    by_device: dict[str, dict[str, ConfigFile]] = {}
    for cell in sorted(cells):
        ct = _load_cell(results, cell)
        files = by_device.setdefault(ct.summary["device_name"], {})
        cf = files.setdefault(ct.config_file, ConfigFile(ct.config_file))
        if cf.cells and cf.cells[0].config_bytes != ct.config_bytes:
            first = cf.cells[0]
            diffs = _differences(first, ct)
            raise ConfigCollision(
                f"config collision on device {ct.summary['device_name']}: cells {first.cell} "
                f"and {ct.cell} both produced {ct.config_file} with different content; "
                f"differing keys: {'; '.join(diffs)}. Expected one content per file name: "
                "tune the shape once, or give the cells different ROCm versions"
            )
        cf.cells.append(ct)
    return by_device


def _entry_verdicts(cf: ConfigFile, min_pct: float) -> dict[int, dict[str, Any]]:
    """Per batch size of the file: each cell's improvement and whether it beat the baseline by
    at least min_pct; `improved` when every cell did."""
    out: dict[int, dict[str, Any]] = {}
    for ct in cf.cells:
        for key, entry in ct.summary["entries"].items():
            base = loaders.baseline_of(entry)
            gain = entry.get("improvement_pct") if base is not None else None
            rec: dict[str, Any] = {
                "improvement_pct": gain,
                "baseline_source": base["source"] if base else None,
                "baseline_config": base["config"] if base else None,
                "beat_baseline": None if gain is None else gain >= min_pct,
            }
            if base is None:
                rec["note"] = "no baseline recorded (summary from before the tuner measured one)"
            elif gain is None:
                rec["note"] = f"baseline not timed: {base.get('error', 'no time recorded')}"
            out.setdefault(int(key), {"cells": {}})["cells"][ct.cell] = rec
    for verdict in out.values():
        verdict["improved"] = all(c["beat_baseline"] is True for c in verdict["cells"].values())
    return out


def _kept_text(cf: ConfigFile, kept: list[int]) -> bytes:
    """The file as vLLM reads it with only the `kept` batch sizes (all: the cell's bytes)."""
    first = cf.cells[0]
    sizes = [int(k) for k in first.table if k != "triton_version"]
    if sorted(kept) == sorted(sizes):
        return first.config_bytes

    entries = {m: first.table[str(m)] for m in kept}
    # rocm=True keeps whatever ROCm keys the cell's entries carry (none on CUDA/CPU files).
    return vllm_config_json(entries, first.table.get("triton_version"), rocm=True).encode()


def _csv_text(rows: list[dict[str, str]]) -> str:

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=AITER_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _device_folder(
    folder: Path, device: str, files: dict[str, ConfigFile], keep: str, min_pct: float
) -> dict[str, Any]:
    """Write one device's JSON files, CSV and manifest into `folder`; returns the manifest."""
    configs: dict[str, Any] = {}
    rows: list[dict[str, str]] = []
    row_keys: dict[tuple[str, ...], str] = {}
    cells: dict[str, Any] = {}
    for name, cf in sorted(files.items()):
        verdicts = _entry_verdicts(cf, min_pct)
        kept = sorted(m for m, v in verdicts.items() if keep == "all" or v["improved"])
        for m, v in verdicts.items():
            v["kept"] = m in kept
        rec: dict[str, Any] = {
            "cells": [c.cell for c in cf.cells],
            "written": bool(kept),
            "entries": {str(m): verdicts[m] for m in sorted(verdicts)},
        }
        if kept:
            atomicio.write_bytes(folder / name, _kept_text(cf, kept))
        else:
            rec["why_not_written"] = (
                f"keep: improved and no batch size beat the baseline by >= {min_pct}% in every "
                "cell that produced it"
            )
        configs[name] = rec
        for ct in cf.cells:
            cells[ct.cell] = _cell_record(ct)
            for row in ct.csv_rows or []:
                if int(row["token"]) not in kept:
                    continue
                key = tuple(row.get(k, "") for k in AITER_KEY)
                if key in row_keys:
                    continue  # the same shape from a cell with the same file: AITER allows one
                row_keys[key] = ct.cell
                rows.append(row)
    meta = folder / META_DIR
    if rows:
        atomicio.write_text(meta / CSV_NAME, _csv_text(rows))
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "device_name": device,
        "keep": keep,
        "min_improvement_pct": min_pct,
        "cells": cells,
        "configs": configs,
        "aiter_csv": {
            "path": f"{META_DIR}/{CSV_NAME}" if rows else None,
            "rows": len(rows),
            "row_from_cell": {",".join(k): c for k, c in row_keys.items()},
        },
    }
    return manifest


def _cell_record(ct: CellTune) -> dict[str, Any]:
    """What the cell's tuner read where it ran (inside the image on the docker runtime)."""
    s = ct.summary
    return {
        "image": ct.image,
        "config_file": ct.config_file,
        "summary": f"{ct.cell}/tune/summary.json",
        "summary_sha256": ct.summary_sha256,
        "device_name": s["device_name"],
        "platform": s["platform"],
        "interpreter": s["interpreter"],
        "backend": s["backend"],
        "mode": s["mode"],
        "vllm_version": s.get("vllm_version"),
        "triton_version": s.get("triton_version"),
        "torch_version": s.get("torch_version"),
        "tuner_version": s.get("tuner_version"),
        "aiter_csv_rows": None if ct.csv_rows is None else len(ct.csv_rows),
    }


def write(
    results: Path,
    cells: list[str],
    out_dir: Path,
    *,
    label: str,
    images: dict[str, Any],
    keep: str = "all",
    min_improvement_pct: float = 3.0,
    code_version: str | None = None,
) -> dict[str, Any]:
    """Gather `cells` into `out_dir` (built in a staging folder and swapped in whole, INDEX.json
    last); returns the index. Every input is checked, and collisions refused, before any write."""
    if keep not in KEEP_CHOICES:
        raise ConfigsError(f"keep={keep!r}: expected one of {', '.join(KEEP_CHOICES)}")
    if not min_improvement_pct >= 0:
        raise ConfigsError(f"min_improvement_pct={min_improvement_pct}: expected a number >= 0")
    missing = sorted({c.split("/", 1)[0] for c in cells} - set(images))
    if missing:
        raise ConfigsError(f"no image facts for {', '.join(missing)} (expected in --images-json)")
    by_device = gather(results, cells)  # raises before anything is written
    git = git_state(paths.REPO_DIR)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    out_dir = Path(out_dir)
    staging = atomicio.staging_dir(out_dir.parent, f".{out_dir.name}.")
    try:
        devices = {}
        for device, files in sorted(by_device.items()):
            folder = staging / device
            folder.mkdir()
            manifest = _device_folder(folder, device, files, keep, min_improvement_pct)
            used = sorted({c["image"] for c in manifest["cells"].values()})
            manifest = {
                "label": label,
                "created_at": created,
                "git": git,
                "tune_code_version": code_version,
                "images": {i: images[i] for i in used},
                **manifest,
            }
            manifest["files"] = {
                str(p.relative_to(folder)): sha256_file(p)
                for p in sorted(folder.rglob("*"))
                if p.is_file()
            }
            atomicio.write_json(folder / META_DIR / MANIFEST_NAME, manifest)
            devices[device] = {
                "folder": device,
                "manifest": f"{device}/{META_DIR}/{MANIFEST_NAME}",
                "manifest_sha256": sha256_file(folder / META_DIR / MANIFEST_NAME),
                "vllm_files": sorted(n for n, c in manifest["configs"].items() if c["written"]),
            }
        index = {
            "schema_version": SCHEMA_VERSION,
            "label": label,
            "created_at": created,
            "git": git,
            "keep": keep,
            "min_improvement_pct": min_improvement_pct,
            "cells": sorted(cells),
            "devices": devices,
        }
        atomicio.write_json(staging / INDEX_NAME, index)  # last: the rule's output
        atomicio.publish_tree(staging)
        atomicio.replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return index


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cellbench.configs",
        description="Gather the cells' tuned vLLM configs and AITER rows per ROCm version and "
        "device.",
    )
    p.add_argument("--label", required=True, help="ROCm version label (archive label)")
    p.add_argument("--results", required=True, type=Path)
    p.add_argument("--cells", nargs="+", required=True)
    p.add_argument("--images-json", required=True, help="per image: digest, ROCm version")
    p.add_argument("--keep", choices=KEEP_CHOICES, default="all")
    p.add_argument("--min-improvement-pct", type=float, default=3.0)
    p.add_argument("--code-version")
    p.add_argument("--out-dir", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        images = json.loads(args.images_json)
        if not isinstance(images, dict):
            raise ConfigsError("--images-json: expected a JSON object of images")
        index = write(
            args.results,
            args.cells,
            args.out_dir,
            label=args.label,
            images=images,
            keep=args.keep,
            min_improvement_pct=args.min_improvement_pct,
            code_version=args.code_version,
        )
    except (ConfigsError, json.JSONDecodeError) as exc:
        print(f"cellbench configs: error: {exc}", file=sys.stderr)
        return 2
    for device, d in index["devices"].items():
        print(f"{args.out_dir / device}: {len(d['vllm_files'])} vLLM file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
