"""The archive's read side: archived runs, their manifests, checks and the previous run of a cell.

An archived run lives at ``{archive_root}/{label}/{run}/`` (written by ``cellbench.archive``):
its cells' result folders, the report over them and MANIFEST.json with the sha256 of every
file. This module only reads: the report (previous-run comparisons and figures) and the
archive's own commands use it, so the report never imports the archive's writer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cellbench.common.atomicio import sha256_file
from cellbench.results.loaders import load as load_result

MANIFEST_NAME = "MANIFEST.json"


RECEIPT_NAME = "ARCHIVED.json"


LATEST = "latest"


DEFAULT_ROOT = Path("results/archive")


class ArchiveError(Exception):
    """A request the archive cannot answer (unknown run, nothing in common): one line."""


def server_versions(results: Path, cell: str) -> dict[str, str | None]:
    """Per arm of ``cell``, the version its running server gave for itself (``GET /version``,
    recorded in bench.json's ``server.version``); null where the server had no such endpoint
    or the file predates the record. Read through the checked loader, like every result."""
    out: dict[str, str | None] = {}
    for bench in sorted((Path(results) / cell / "serve").glob("*/bench.json")):
        data = load_result(bench, Path(results)).data
        seen = (data.get("server") or {}).get("version") or {}
        out[str(data.get("arm", bench.parent.name))] = seen.get("version")
    return out


def server_packages(results: Path, cell: str) -> dict[str, dict]:
    """Per arm of ``cell``, what its server's own environment held, as bench.json recorded it:
    ``server_packages`` (asked of the server's interpreter on the local runtime) and vLLM's
    GET /version answer (``vllm_said``). Empty dicts for files from before either existed."""
    out: dict[str, dict] = {}
    for bench in sorted((Path(results) / cell / "serve").glob("*/bench.json")):
        data = load_result(bench, Path(results)).data
        seen = dict(data.get("server_packages") or {"read_from": None})
        seen["vllm_said"] = ((data.get("server") or {}).get("version") or {}).get("version")
        out[str(data.get("arm", bench.parent.name))] = seen
    return out


def stage_results(cell_dir: Path) -> list[Path]:
    """A cell's stage results: what the archive checks and its report reads."""
    return sorted(
        [cell_dir / "tune" / "summary.json"]
        + list(cell_dir.glob("serve/*/bench.json"))
        + list(cell_dir.glob("gsm8k/*.json"))
    )


def gate_result(cell_dir: Path) -> list[Path]:
    """The cell's GSM8K gate verdict, when its gate job has run: archived and shown in the
    run's report, but a judgement, not a measurement, so not one of the stage results that
    tell one run's numbers from another's."""
    path = cell_dir / "gate.json"
    return [path] if path.is_file() else []


def is_stage_result(relpath: str, cell: str) -> bool:
    """Whether ``relpath`` (under a run folder or results/) is one of ``cell``'s stage results,
    the same set ``stage_results`` globs."""
    if not relpath.startswith(cell + "/"):
        return False
    rest = relpath[len(cell) + 1 :].split("/")
    return (
        rest == ["tune", "summary.json"]
        or (len(rest) == 3 and rest[0] == "serve" and rest[2] == "bench.json")
        or (len(rest) == 2 and rest[0] == "gsm8k" and rest[1].endswith(".json"))
    )


@dataclass(frozen=True)
class Run:
    label: str
    name: str
    path: Path

    @property
    def ref(self) -> str:
        return f"{self.label}/{self.name}"


def read_manifest(run_dir: Path) -> dict | None:
    try:
        data = json.loads((run_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runs(archive_root: Path, label: str | None = None) -> list[Run]:
    """Archived runs, oldest first (by name: it starts with the UTC time). Temporary folders
    (dot names), ``latest`` and loose files are not runs."""
    archive_root = Path(archive_root)
    labels = [label] if label else sorted(p.name for p in _dirs(archive_root))
    found = []
    for lab in labels:
        for path in _dirs(archive_root / lab):
            found.append(Run(lab, path.name, path))
    return sorted(found, key=lambda r: (r.name, r.label))


def _dirs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    )


def resolve(archive_root: Path, ref: str) -> Run:
    """A run named ``LABEL/RUN``, ``RUN`` (unique over labels), ``LABEL/latest`` or ``latest``
    (when the archive holds one label). Raises ArchiveError naming what exists."""
    archive_root = Path(archive_root)
    every = runs(archive_root)
    labels = sorted({r.label for r in every})
    label, _, name = ref.rpartition("/")
    if name == LATEST:
        if not label:
            if len(labels) != 1:
                choices = (
                    ", ".join(f"{lab}/latest" for lab in labels) or "none: the archive is empty"
                )
                raise ArchiveError(
                    f"'latest' is ambiguous in {archive_root}; name one of {choices}"
                )
            label = labels[0]
        link = archive_root / label / LATEST
        if not link.is_symlink():
            raise ArchiveError(f"no run archived under {archive_root / label} (no {LATEST} link)")
        name = os.readlink(link)
    matches = [r for r in every if r.name == name and (not label or r.label == label)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = ", ".join(r.ref for r in matches)
        raise ArchiveError(f"run {ref!r} is in several labels ({names}); write LABEL/RUN")
    raise ArchiveError(
        f"no archived run {ref!r} in {archive_root} "
        f"(`python -m cellbench.archive list --archive-root {archive_root}` lists {len(every)})"
    )


@dataclass
class Check:
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    manifest_unreadable: bool = False

    def ok(self) -> bool:
        return not (self.changed or self.missing or self.extra or self.manifest_unreadable)


def check_run(run_dir: Path) -> Check:
    """Recompute every checksum of a run folder against its manifest."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return Check(manifest_unreadable=True)
    listed = manifest["files"]
    present = {
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.name != MANIFEST_NAME
    }
    check = Check()
    for name, digest in sorted(listed.items()):
        path = run_dir / name
        if not path.is_file():
            check.missing.append(name)
        elif sha256_file(path) != digest:
            check.changed.append(name)
    check.extra = sorted(present - set(listed))
    return check


def verify(path: Path) -> list[str]:
    """Names of the files of a run (its folder or its MANIFEST.json) that changed, went
    missing or appeared since it was archived; empty when it is intact."""
    path = Path(path)
    check = check_run(path.parent if path.name == MANIFEST_NAME else path)
    if check.manifest_unreadable:
        return [MANIFEST_NAME]
    return sorted(check.changed + check.missing + check.extra)


def _stage_checksums(files: dict[str, str], cell: str) -> dict[str, str]:
    return {k: v for k, v in files.items() if is_stage_result(k, cell)}


def previous_run(archive_root: Path, results: Path, cell: str) -> Run | None:
    """The newest archived run holding ``cell`` whose stage results differ from the ones in
    ``results`` now (checksums): a run archived from these very results is passed over."""
    results = Path(results)
    current = {
        str(p.relative_to(results)): sha256_file(p)
        for p in stage_results(results / cell)
        if p.is_file()
    }
    for run in reversed(runs(archive_root)):
        manifest = read_manifest(run.path)
        if not manifest or cell not in manifest.get("cells", []):
            continue
        if _stage_checksums(manifest.get("files", {}), cell) != current:
            return run
    return None
