"""One result file as its stage writes it and every loader reads it: its kind (from where it
lies), the refusal (``ResultError``) naming file, field, value and the job to rerun, the checked
result (``Result``), reading it whole against its recorded checksum, and one schema check per
kind (``check_bench``, ``check_comparison``, ``check_gsm8k``, ``check_tune``, ``check_gate``)
that the stage calls before it writes and the loader calls after it reads.

The per-kind loaders (``cellbench.results.loaders``) add what a schema cannot say.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from cellbench.common import atomicio, paths

SCHEMA_DIR = paths.SCHEMA_DIR
TUNE, VLLM_CONFIG, BENCH, GSM8K, COMPARISON, GATE = (
    "tune",
    "vllm_config",
    "bench",
    "gsm8k",
    "comparison",
    "gate",
)
KINDS = (TUNE, VLLM_CONFIG, BENCH, GSM8K, COMPARISON, GATE)
# Every result a loader accepts was vouched for by the checksum its stage recorded; the
# index entries still say so, for readers of earlier reports.
VERIFIED = "verified"


class ResultError(Exception):
    """A result file that must not be used. ``str()`` is the whole message for the user."""

    def __init__(self, path: Path | str, field: str, value: Any, expected: str, rerun: str):
        self.path, self.field, self.value = str(path), field, value
        self.expected, self.rerun = expected, rerun
        # Markers such as "(absent)" as they are; values as JSON, so "4" reads apart from 4.
        marker = isinstance(value, str) and value.startswith("(") and value.endswith(")")
        shown = value if marker else json.dumps(value, default=str)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        super().__init__(
            f"bad result file {self.path}: {field} = {shown}: {expected}; "
            f"rerun the job that wrote it: {rerun}"
        )


@dataclass(frozen=True)
class Result:
    """A checked result file: its kind, content and sha256, and whether a recorded checksum
    vouched for it."""

    path: Path
    kind: str
    data: dict[str, Any]
    sha256: str
    checksum: str

    def index_entry(self) -> dict[str, str]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "sha256": self.sha256,
            "checksum": self.checksum,
        }


def rerun_hint(path: Path | str, kind: str) -> str:
    """The command that rebuilds ``path`` (and, through newer inputs, what reads it)."""
    path = Path(path)
    if kind == VLLM_CONFIG:
        # The configs folder and the summary come from one tune job; force it by its summary.
        path = path.parent.parent / "summary.json"
    return f"snakemake --cores 2 --forcerun {path} (with your --configfile, if any)"


def kind_of(path: Path | str, results: Path | str | None = None) -> str:
    """Which result ``path`` is, from where it lies (the layout of docs/design.md)."""
    path = Path(path)
    parts = path.parts
    if results is not None:
        try:
            parts = path.resolve().relative_to(Path(results).resolve()).parts
        except ValueError:
            pass
    if path.name == "bench.json" and "compare" in parts[:1]:
        return COMPARISON
    if path.name == "bench.json" and len(parts) >= 3 and parts[-3] == "serve":
        return BENCH
    if path.name == "summary.json" and path.parent.name == "tune":
        return TUNE
    if (
        path.suffix == ".json"
        and path.parent.name == "configs"
        and path.parent.parent.name == "tune"
    ):
        return VLLM_CONFIG
    if path.suffix == ".json" and path.parent.name == "gsm8k":
        return GSM8K
    if path.name == "gate.json":
        return GATE
    raise ResultError(
        path,
        "(file name)",
        path.name,
        "not a stage result (expected tune/summary.json, tune/configs/*.json, "
        "serve/{arm}/bench.json, gsm8k/{arm}.json, gate.json or compare/.../bench.json)",
        "nothing: pass only stage results",
    )


@functools.cache
def schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / name).read_text())


def _field(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def check_schema(
    data: Any, schema: dict[str, Any], path: Path, rerun: str, prefix: str = ""
) -> None:
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if not errors:
        return
    error = jsonschema.exceptions.best_match(errors)
    where = list(error.absolute_path)
    value: Any = error.instance
    expected = error.message
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        where.append(missing[0])
        value, expected = "(absent)", "a required field"
    field = _field(where)
    if prefix and where:
        field = prefix + ("" if field.startswith("[") else ".") + field
    elif prefix:
        field = prefix
    raise ResultError(path, field, value, f"schema: {expected}", rerun)


def read(path: Path, kind: str) -> tuple[Any, str, str]:
    """The parsed JSON, its sha256, and ``VERIFIED``: a file whose recorded checksum is gone
    is refused like one that no longer matches it (deleting the sidecar must not switch the
    check off)."""
    rerun = rerun_hint(path, kind)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ResultError(path, "(file)", "(absent)", "the file must exist", rerun) from None
    except OSError as exc:
        raise ResultError(path, "(file)", str(exc), "the file must be readable", rerun) from None
    digest = hashlib.sha256(raw).hexdigest()
    recorded = atomicio.recorded_checksum(path)
    if recorded is not None and recorded != digest:
        raise ResultError(
            path,
            "(sha256)",
            digest,
            f"changed after it was written: its stage recorded {recorded or '(empty)'} in "
            f"{atomicio.checksum_path(path).name}",
            rerun,
        )
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ResultError(
            path,
            "(whole file)",
            f"({len(raw)} bytes)",
            f"whole JSON expected; truncated or corrupt at line {exc.lineno} column "
            f"{exc.colno} ({exc.msg})",
            rerun,
        ) from None
    except UnicodeDecodeError as exc:
        raise ResultError(
            path, "(whole file)", f"({len(raw)} bytes)", f"UTF-8 JSON expected ({exc})", rerun
        ) from None
    if recorded is None:
        raise ResultError(
            path,
            "(sha256)",
            "(no checksum recorded)",
            f"the checksum its stage recorded in {atomicio.checksum_path(path).name}: a "
            "result without it cannot be told from one edited by hand",
            rerun,
        )
    if not isinstance(data, dict):
        raise ResultError(path, "(top level)", type(data).__name__, "a JSON object", rerun)
    return data, digest, VERIFIED


def place(path: Path, results: Path | None, depth: int) -> list[str] | None:
    """The path's parts below ``results`` (None when it does not lie there)."""
    if results is None:
        return None
    try:
        parts = path.resolve().relative_to(Path(results).resolve()).parts
    except ValueError:
        return None
    return list(parts) if len(parts) >= depth else None


def expect_equal(path: Path, rerun: str, field: str, found: Any, expected: Any, why: str) -> None:
    if found != expected:
        raise ResultError(path, field, found, f"{why} ({json.dumps(expected)})", rerun)


def _check_kind(data: Any, path: Path | str, kind: str, name: str) -> None:
    path = Path(path)
    check_schema(data, schema(name), path, rerun_hint(path, kind))


def check_bench(data: Any, path: Path | str) -> None:
    """Refuse an arm's bench.json content unless it fits bench.schema.json."""
    _check_kind(data, path, BENCH, "bench.schema.json")


def check_gsm8k(data: Any, path: Path | str) -> None:
    """Refuse an arm's GSM8K summary unless it fits gsm8k.schema.json."""
    _check_kind(data, path, GSM8K, "gsm8k.schema.json")


def check_tune(data: Any, path: Path | str) -> None:
    """Refuse a tuning summary unless it fits tune.schema.json."""
    _check_kind(data, path, TUNE, "tune.schema.json")


def check_gate(data: Any, path: Path | str) -> None:
    """Refuse a cell's gate.json content unless it fits gate.schema.json."""
    _check_kind(data, path, GATE, "gate.schema.json")


def check_comparison(data: Any, path: Path | str) -> None:
    """Refuse an image comparison unless it fits compare.schema.json and each of its points
    fits bench.schema.json's point schema."""
    path = Path(path)
    rerun = rerun_hint(path, COMPARISON)
    check_schema(data, schema("compare.schema.json"), path, rerun)
    point_schema = schema("bench.schema.json")["properties"]["points"]["items"]
    for i, point in enumerate(data["points"]):
        check_schema(point, point_schema, path, rerun, prefix=f"points[{i}]")
