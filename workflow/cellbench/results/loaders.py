"""Load stage results, checked: the only way the report, the archive and comparisons read them.

One loader per kind of result file. Each refuses a file that is not what its stage writes,
with one ``ResultError`` naming the file, the field, the value found, what was expected, and
the job to rerun. Checked, in order:

1. the file can be read and is whole JSON (a truncated file is refused, not a traceback);
2. the checksum recorded when the stage wrote it (``NAME.sha256`` beside it, written by
   ``atomicio.write_*(..., checksum=True)``) still matches. A file without its sidecar
   (deleted, or written by hand) is refused like a changed one;
3. its JSON schema (``workflow/schemas/``);
4. what a schema cannot say: ``completed + failed`` equal to the prompts sent, percentiles in
   order, a GSM8K score equal to the mean of its per-sample results, the tuned configs in
   vLLM's file equal to the summary's, the file's cell and arm equal to where it lies.

    python -m cellbench.results FILE...     # check files by hand; exit 1 on the first bad one
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.contracts.point import point_key
from cellbench.contracts.request_detail import DETAIL_KEYS
from cellbench.contracts.result_file import (
    BENCH,
    COMPARISON,
    GATE,
    GSM8K,
    TUNE,
    VLLM_CONFIG,
    Result,
    ResultError,
    check_bench,
    check_comparison,
    check_gate,
    check_gsm8k,
    check_tune,
    expect_equal,
    kind_of,
    place,
    read,
    rerun_hint,
)

# vLLM's six fused-MoE keys (positive integers) and the ROCm extras (non-negative integers).
VLLM_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
ROCM_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
LATENCIES = ("ttft", "tpot", "itl", "e2el")
# lm-eval writes the score and the per-sample results from the same run; they agree to
# rounding of a float mean.
SCORE_TOLERANCE = 1e-9


def _check_point(point: dict[str, Any], path: Path, rerun: str, field: str) -> None:
    sent = point["num_prompts"]
    if point["completed"] + point["failed"] != sent:
        raise ResultError(
            path,
            f"{field}.completed",
            point["completed"],
            f"completed + failed ({point['completed']} + {point['failed']}) must equal the "
            f"prompts sent, num_prompts = {sent}",
            rerun,
        )
    for name in LATENCIES:
        median, p99 = point[f"median_{name}_ms"], point[f"p99_{name}_ms"]
        if median > p99:
            raise ResultError(
                path,
                f"{field}.median_{name}_ms",
                median,
                f"a median cannot exceed the p99 (p99_{name}_ms = {p99})",
                rerun,
            )
    for name, value in point.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ResultError(path, f"{field}.{name}", str(value), "a finite number", rerun)


STOP_FIELDS = ("starts_cap", "starts_used", "stop_reason")


def _check_stopping(points: list[dict[str, Any]], path: Path, rerun: str, where: str) -> None:
    """Points measured with sequential starts (``starts_cap``; cellbench.serve.repeat_stop):
    all of a side's points carry the fields or none does, one cap for them all, and each grid
    point's repeats agree on its starts used and stop reason, which is the number of its
    server starts here and at most the cap. Files without the fields (fixed starts) pass."""
    have = [("starts_cap" in p) for p in points]
    if not any(have):
        return
    if not all(have):
        i = have.index(False)
        raise ResultError(path, f"{where}[{i}].starts_cap", None, "on every point or none", rerun)
    caps = sorted({p["starts_cap"] for p in points})
    if len(caps) > 1:
        raise ResultError(path, f"{where}[].starts_cap", caps, "one cap for the whole job", rerun)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        missing = [k for k in STOP_FIELDS if k not in p]
        if missing:
            raise ResultError(
                path, f"{where}[{i}]", f"(missing {missing})", "starts_cap with its fields", rerun
            )
        groups.setdefault(point_key(p), []).append(i)
    for key, idx in groups.items():
        recorded = {tuple(points[i][k] for k in STOP_FIELDS) for i in idx}
        if len(recorded) > 1:
            raise ResultError(
                path,
                f"{where}[{idx[0]}].starts_used",
                sorted(recorded),
                f"one starts-used count and stop reason for grid point {key}",
                rerun,
            )
        ((cap, used, _),) = recorded
        starts = {points[i].get("start", 0) for i in idx}
        if used != len(starts) or used > cap:
            raise ResultError(
                path,
                f"{where}[{idx[0]}].starts_used",
                used,
                f"the number of server starts of grid point {key} here ({len(starts)}), at most "
                f"the cap {cap}",
                rerun,
            )


def load_bench(path: Path | str, results: Path | str | None = None) -> Result:
    """A cell's ``serve/{arm}/bench.json`` (bench.schema.json)."""
    path = Path(path)
    rerun = rerun_hint(path, BENCH)
    data, digest, checksum = read(path, BENCH)
    check_bench(data, path)
    expect_equal(path, rerun, "arm", data["arm"], path.parent.name, "the arm of its folder")
    parts = place(path, results, 6)
    if parts is not None:
        expect_equal(
            path, rerun, "cell", data["cell"], "/".join(parts[:3]), "the cell of its folder"
        )
    if not data["image_digest"]:
        raise ResultError(
            path,
            "image_digest",
            data["image_digest"],
            "the digest (or local environment) the numbers came from",
            rerun,
        )
    for i, point in enumerate(data["points"]):
        _check_point(point, path, rerun, f"points[{i}]")
    seqs = [p["seq"] for p in data["points"]]
    if len(set(seqs)) != len(seqs):
        raise ResultError(path, "points[].seq", seqs, "each point's seq must be unique", rerun)
    _check_stopping(data["points"], path, rerun, "points")
    if "capacity" in data:  # serve.sla's search: each capacity as its probes give it
        from cellbench.contracts.capacity import consistency_problem

        problem = consistency_problem(data["capacity"])
        if problem is not None:
            field, value, expected = problem
            raise ResultError(path, f"capacity.{field}", value, expected, rerun)
    return Result(path, BENCH, data, digest, checksum)


def load_requests(path: Path | str) -> list[dict[str, Any]]:
    """A side's per-request sidecar, ``requests.jsonl.gz`` beside its bench.json
    (``cellbench.contracts.request_detail``): its checksum checked, one record per point, every
    per-request list as long as the point's requests."""
    import gzip

    path = Path(path)
    rerun = rerun_hint(path.with_name("bench.json"), BENCH)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ResultError(path, "(file)", str(exc), "the file must be readable", rerun) from None
    recorded = atomicio.recorded_checksum(path)
    digest = hashlib.sha256(raw).hexdigest()
    if recorded is None:
        raise ResultError(
            path, "(sha256)", "(no checksum recorded)",
            f"the checksum its stage recorded in {atomicio.checksum_path(path).name}", rerun,
        )  # fmt: skip
    if recorded != digest:
        raise ResultError(
            path, "(sha256)", digest, f"changed after it was written (recorded {recorded})", rerun
        )
    try:
        lines = gzip.decompress(raw).decode().splitlines()
        records = [json.loads(line) for line in lines if line]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultError(
            path, "(whole file)", f"({len(raw)} bytes)", f"gzip of JSON lines ({exc})", rerun
        ) from None
    for i, rec in enumerate(records):
        missing = [k for k in ("seq", *DETAIL_KEYS) if k not in rec]
        if missing:
            raise ResultError(path, f"[{i}]", f"(missing {missing})", "every detail key", rerun)
        lengths = {k: len(rec[k]) for k in DETAIL_KEYS}
        if len(set(lengths.values())) != 1:
            raise ResultError(path, f"[{i}]", lengths, "one entry per request in each", rerun)
    return records


def load_comparison(path: Path | str, results: Path | str | None = None) -> Result:
    """An image comparison, ``compare/A-vs-B/MODEL/tpN-epM/bench.json`` (compare.schema.json,
    each point also bench.schema.json's point)."""
    path = Path(path)
    rerun = rerun_hint(path, COMPARISON)
    data, digest, checksum = read(path, COMPARISON)
    check_comparison(data, path)
    parts = place(path, results, 5)
    if parts is not None:
        expect_equal(
            path,
            rerun,
            "comparison",
            data["comparison"],
            "/".join(parts[1:4]),
            "the comparison of its folder",
        )
    images = data["images"]
    expect_equal(
        path,
        rerun,
        "sides",
        sorted(data["sides"]),
        sorted(images),
        "one side per image of `images`",
    )
    for name, side in data["sides"].items():
        if not side["image_digest"]:
            raise ResultError(
                path,
                f"sides.{name}.image_digest",
                side["image_digest"],
                "the digest (or local environment) the side ran",
                rerun,
            )
    for i, point in enumerate(data["points"]):
        if point["image"] not in images:
            raise ResultError(
                path,
                f"points[{i}].image",
                point["image"],
                f"one of the compared images {images}",
                rerun,
            )
        _check_point(point, path, rerun, f"points[{i}]")
    for image in images:  # each side's points alone (one side's grid point per repeat)
        side = [p for p in data["points"] if p["image"] == image]
        _check_stopping(side, path, rerun, f"points(image={image})")
    return Result(path, COMPARISON, data, digest, checksum)


def load_gsm8k(path: Path | str, results: Path | str | None = None) -> Result:
    """A cell's ``gsm8k/{arm}.json`` (gsm8k.schema.json): its scores must be the means of its
    own per-sample results."""
    path = Path(path)
    rerun = rerun_hint(path, GSM8K)
    data, digest, checksum = read(path, GSM8K)
    check_gsm8k(data, path)
    expect_equal(path, rerun, "arm", data["arm"], path.stem, "the arm its file is named for")
    parts = place(path, results, 5)
    if parts is not None:
        expect_equal(
            path, rerun, "cell", data["cell"], "/".join(parts[:3]), "the cell of its folder"
        )
    samples = data["per_sample"]
    expect_equal(
        path,
        rerun,
        "n_samples",
        data["n_samples"],
        len(samples),
        "the number of per_sample entries",
    )
    ids = [s["doc_id"] for s in samples]
    if len(set(ids)) != len(ids):
        raise ResultError(path, "per_sample[].doc_id", sorted(ids), "each question once", rerun)
    # doc_key pairs runs by question; files written before it have none and still load.
    _check_gsm8k_rows(path, rerun, "", data, samples)
    for k, inst in enumerate(data.get("instances") or []):
        where = f"instances[{k}]."
        expect_equal(path, rerun, f"{where}instance", inst["instance"], k + 1, "start order")
        expect_equal(
            path,
            rerun,
            f"{where}n_samples",
            inst["n_samples"],
            len(inst["per_sample"]),
            "the number of its per_sample entries",
        )
        _check_gsm8k_rows(path, rerun, where, inst, inst["per_sample"])
    return Result(path, GSM8K, data, digest, checksum)


def _check_gsm8k_rows(path: Path, rerun: str, where: str, data: dict, samples: list[dict]) -> None:
    """Each doc_key once (where present), and the scores equal the means of the rows."""
    keys = [s["doc_key"] for s in samples if "doc_key" in s]
    if len(set(keys)) != len(keys):
        raise ResultError(
            path, f"{where}per_sample[].doc_key", sorted(keys), "each question once", rerun
        )
    for score, key in (("strict_match", "strict"), ("flexible_extract", "flexible")):
        mean = sum(bool(s[key]) for s in samples) / len(samples)
        if abs(data[score] - mean) > SCORE_TOLERANCE:
            raise ResultError(
                path,
                f"{where}{score}",
                data[score],
                f"the mean of {where}per_sample[].{key} ({sum(bool(s[key]) for s in samples)} "
                f"of {len(samples)} = {mean:.6g})",
                rerun,
            )


def _check_config(config: Any, path: Path, rerun: str, field: str) -> None:
    if not isinstance(config, dict):
        raise ResultError(path, field, config, "an object of vLLM's config keys", rerun)
    for key in VLLM_KEYS:
        value = config.get(key)
        if type(value) is not int or value < 1:
            raise ResultError(
                path,
                f"{field}.{key}",
                "(absent)" if key not in config else value,
                "a positive integer",
                rerun,
            )
    for key, value in config.items():
        if key in VLLM_KEYS:
            continue
        if key not in ROCM_KEYS:
            raise ResultError(
                path,
                f"{field}.{key}",
                value,
                f"no such key in a vLLM fused-MoE config (known: "
                f"{', '.join(VLLM_KEYS + ROCM_KEYS)})",
                rerun,
            )
        if type(value) is not int or value < 0:
            raise ResultError(path, f"{field}.{key}", value, "a non-negative integer", rerun)


def _batch_size(key: str, path: Path, rerun: str) -> int:
    if not (key.isascii() and key.isdigit() and not key.startswith("0")):
        raise ResultError(
            path, f"[{key!r}]", key, "a batch size: a positive integer written in decimal", rerun
        )
    return int(key)


def load_vllm_config(path: Path | str, results: Path | str | None = None) -> Result:
    """A tuned config in vLLM's format, ``tune/configs/E=..,N=..,device_name=...json``:
    batch sizes (positive integers) to configs, plus an optional ``triton_version``."""
    path = Path(path)
    rerun = rerun_hint(path, VLLM_CONFIG)
    data, digest, checksum = read(path, VLLM_CONFIG)
    sizes = []
    for key, value in data.items():
        if key == "triton_version":
            if not isinstance(value, str) or not value:
                raise ResultError(path, key, value, "a Triton version string", rerun)
            continue
        sizes.append(_batch_size(key, path, rerun))
        _check_config(value, path, rerun, f"[{key!r}]")
    if not sizes:
        raise ResultError(path, "(batch sizes)", [], "at least one batch size's config", rerun)
    return Result(path, VLLM_CONFIG, data, digest, checksum)


def load_tune(path: Path | str, results: Path | str | None = None) -> Result:
    """A cell's ``tune/summary.json`` (tune.schema.json), and the vLLM config it names beside
    it, which must hold exactly the summary's picks."""
    path = Path(path)
    rerun = rerun_hint(path, TUNE)
    data, digest, checksum = read(path, TUNE)
    check_tune(data, path)
    entries = data["entries"]
    for key, entry in entries.items():
        _check_config(entry["config"], path, rerun, f"entries[{key!r}].config")
    picked = sorted(int(k) for k in entries)
    skipped = sorted(data["skipped_batch_sizes"])
    expect_equal(
        path,
        rerun,
        "batch_sizes",
        sorted(data["batch_sizes"]),
        sorted(picked + skipped),
        "the batch sizes picked (entries) plus those skipped",
    )
    expect_equal(
        path,
        rerun,
        "complete",
        data["complete"],
        not skipped,
        "true exactly when no batch size was skipped",
    )
    vllm_path = path.parent / "configs" / data["config_file"]
    vllm = load_vllm_config(vllm_path, results).data
    in_file = sorted(int(k) for k in vllm if k != "triton_version")
    expect_equal(
        vllm_path, rerun, "(batch sizes)", in_file, picked, f"the batch sizes of {path.name}"
    )
    for key, entry in entries.items():
        mine = {k: v for k, v in entry["config"].items() if k in VLLM_KEYS}
        theirs = {k: v for k, v in vllm[key].items() if k in VLLM_KEYS}
        expect_equal(
            vllm_path,
            rerun,
            f"[{key!r}]",
            theirs,
            mine,
            f"the config {path.name} picked for batch size {key}",
        )
    for key, entry in entries.items():
        _check_baseline(entry, path, rerun, f"entries[{key!r}]")
    return Result(path, TUNE, data, digest, checksum)


# improvement_pct is computed from the two medians it sits beside; JSON keeps floats exactly,
# so only rounding by a hand-edited file would differ.
IMPROVEMENT_TOLERANCE = 1e-6


def _check_baseline(entry: dict[str, Any], path: Path, rerun: str, field: str) -> None:
    """A recorded baseline's improvement must follow from its two side-by-side medians."""
    base = entry.get("baseline")
    if base is None:
        return
    gain = entry.get("improvement_pct", "(absent)")
    if base["time_us"] is None or base["tuned_time_us"] is None:
        expect_equal(path, rerun, f"{field}.improvement_pct", gain, None,
                      "null: the baseline was not timed")  # fmt: skip
        return
    if base.get("same_as_tuned"):
        expected = 0.0
    else:
        expected = 100.0 * (base["time_us"] - base["tuned_time_us"]) / base["time_us"]
    if not isinstance(gain, int | float) or abs(gain - expected) > IMPROVEMENT_TOLERANCE:
        raise ResultError(
            path,
            f"{field}.improvement_pct",
            gain,
            f"100 * (baseline.time_us - baseline.tuned_time_us) / baseline.time_us "
            f"({expected:.6g})",
            rerun,
        )


def baseline_of(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A tune summary entry's measured baseline, or None for a summary written before the
    tuner measured one (such entries have no improvement to judge)."""
    return entry.get("baseline")


def load_gate(path: Path | str, results: Path | str | None = None) -> Result:
    """A cell's ``gate.json`` (gate.schema.json): its verdict must follow from its checks."""
    path = Path(path)
    rerun = rerun_hint(path, GATE)
    data, digest, checksum = read(path, GATE)
    check_gate(data, path)
    parts = place(path, results, 4)
    if parts is not None:
        expect_equal(
            path, rerun, "cell", data["cell"], "/".join(parts[:3]), "the cell of its folder"
        )
    expect_equal(
        path,
        rerun,
        "passed",
        data["passed"],
        all(c["passed"] for c in data["checks"]),
        "whether every check passed",
    )
    return Result(path, GATE, data, digest, checksum)


LOADERS = {
    TUNE: load_tune,
    VLLM_CONFIG: load_vllm_config,
    BENCH: load_bench,
    GSM8K: load_gsm8k,
    COMPARISON: load_comparison,
    GATE: load_gate,
}


def load(path: Path | str, results: Path | str | None = None) -> Result:
    """Check and load any stage result, its kind told by where it lies under ``results``."""
    kind = kind_of(path, results)
    return LOADERS[kind](path, results)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    for name in argv:
        try:
            result = load(name)
        except ResultError as exc:
            print(f"cellbench: error: {exc}", file=sys.stderr)
            return 1
        print(f"{name}: {result.kind}, {result.checksum}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
