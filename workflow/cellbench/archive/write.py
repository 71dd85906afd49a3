"""An append-only archive of finished runs per ROCm version, and what two runs differ in.

Layout: ``{archive_root}/{label}/{run}/`` holds one archived run: its cells' result folders,
the report over them and MANIFEST.json (image digests, git commit and dirty flag, config hash,
host, tuner and server package versions, the measurement's start and end, sha256 of every file).
``run`` names the UTC time it was archived and the digests (or, on the local runtime, the host
environment) it ran with. A run folder is built in a temporary folder beside it and renamed into
place whole; nothing writes into it afterwards (its files are made read-only too). ``latest``
in the label folder is a symlink to the run archived or found last, replaced in one step.
``ARCHIVED.json`` (the Snakemake rule's output, written last) says which run the job archived
or found: Snakemake deletes a job's outputs before it runs and after it fails, so nothing else
depends on it.

Archiving the very same run again (same digests, config hash, commit and result checksums)
adds nothing and says so; any re-measurement is a new run folder. Every result is checked
through ``cellbench.results.loaders`` before it is copied.
The cells' jobs' Snakemake benchmark files are copied (``benchmarks/<cell>/``, checked as
benchmark files, hashed in the manifest like the rest): the walls `cellbench plan` reads.

    python -m cellbench.archive build --label rocm7.2 --results results --cells CELL... \
        --digests IMAGE=DIGEST... --config-hash H
    python -m cellbench.archive list
    python -m cellbench.archive show RUN          (LABEL/RUN, RUN, latest or LABEL/latest)
    python -m cellbench.archive verify [RUN]      (every run when omitted; exit 1 on a problem)
    python -m cellbench.archive diff RUN_A RUN_B  (the cells both hold: A vs B per arm)

Every subcommand takes ``--archive-root`` (default results/archive).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio, paths
from cellbench.common.atomicio import sha256_file
from cellbench.common.gitstate import git_state
from cellbench.contracts.result_file import ResultError
from cellbench.report import build as report
from cellbench.report import plots
from cellbench.report.previous import diff_runs
from cellbench.results import job_times, whole_sets
from cellbench.results.archived import (
    DEFAULT_ROOT,
    LATEST,
    MANIFEST_NAME,
    RECEIPT_NAME,
    ArchiveError,
    Run,
    check_run,
    gate_result,
    read_manifest,
    resolve,
    runs,
    server_packages,
    server_versions,
    stage_results,
)
from cellbench.results.loaders import load as load_result

PACKAGES = (
    "cellbench",
    "snakemake",
    "torch",
    "triton",
    "transformers",
    "lm_eval",
    "docker",
    "pandas",
    "requests",
    "tokenizers",
    "aiohttp",
    "vllm",
)


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def environment() -> dict[str, str]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
    }


def tuner_packages(results: Path, cells: list[str]) -> dict[str, dict[str, str | None]]:
    """Per cell, the versions the tuner read where it ran (inside the image on the docker
    runtime; the workflow's interpreter on the local one): its tune summary's torch, Triton,
    vLLM, Python and tuner versions (null where the summary has none). The tuner's, not the
    server's: those are ``server_packages``. Manifests from before the rename call these
    ``measured_packages``. The host's own versions are ``host_packages``."""
    out = {}
    for cell in cells:
        summary = load_result(results / cell / "tune" / "summary.json", results).data
        out[cell] = {
            "read_from": f"{cell}/tune/summary.json",
            "platform": summary.get("platform"),
            **{
                k: summary.get(f"{k}_version")
                for k in ("torch", "triton", "vllm", "python", "tuner")
            },
        }
    return out


def measurement_window(results: Path, cells: list[str]) -> dict:
    """The earliest and latest timestamps the cells' serve results record (bench.json's
    ``started``/``finished`` and every point's ``started_at``), and where they were read. Tune
    summaries and GSM8K files record no time, so they add none; null when nothing did."""
    stamps: list[tuple[datetime, str]] = []
    read_from = []
    for cell in cells:
        for path in sorted((results / cell).glob("serve/*/bench.json")):
            data = load_result(path, results).data
            found = [data.get("started"), data.get("finished")]
            found += [p.get("started_at") for p in data.get("points", [])]
            parsed = [(_parse_time(s), s) for s in found if isinstance(s, str)]
            parsed = [(when, text) for when, text in parsed if when is not None]
            if parsed:
                read_from.append(str(path.relative_to(results)))
                stamps += parsed
    if not stamps:
        return {"start": None, "end": None, "read_from": [], "note": "no result recorded a time"}
    # As the files wrote them: the earliest and the latest.
    return {
        "start": min(stamps)[1],
        "end": max(stamps)[1],
        "read_from": read_from,
        "fields": "bench.json started, finished and points[].started_at",
    }


def _parse_time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _digest_part(image: str, digest: str) -> str:
    if digest.startswith("sha256:"):
        return f"{image}-{digest.removeprefix('sha256:')[:12]}"
    return f"{image}-{digest}" if not digest.startswith("local:") else digest


def run_name(created: datetime, digests: dict[str, str]) -> str:
    """The run folder's name: UTC time, then each image with its short digest (or the host
    environment the local runtime ran with), e.g. 20261204T100000Z_rocm7.2-3f2a9c1b0d4e."""
    parts = sorted({_digest_part(image, d) for image, d in digests.items()})
    name = created.strftime("%Y%m%dT%H%M%SZ") + ("_" + "_".join(parts) if parts else "")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def _temporary(folder: str, names: list[str]) -> set[str]:
    """What a copy of a cell leaves out: dot names, the temporary files of writes under way
    (atomicio writes ``.NAME.*.tmp`` and renames it)."""
    return {name for name in names if name.startswith(".")}


def _cell_checksums(results: Path, cells: list[str]) -> dict[str, str]:
    """sha256 of every file a copy of the cells' folders takes, by path under ``results``."""
    return {
        str(p.relative_to(results)): sha256_file(p)
        for cell in cells
        for p in sorted((results / cell).rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(results).parts)
    }


def _same_run(manifest: dict, digests: dict, config_hash: str, commit, cells, checksums) -> bool:
    archived = {
        k: v
        for k, v in manifest.get("files", {}).items()
        if any(k.startswith(c + "/") for c in cells)
    }
    return (
        manifest.get("images") == digests
        and manifest.get("config_sha256") == config_hash
        and (manifest.get("git") or {}).get("commit") == commit
        and sorted(manifest.get("cells", [])) == sorted(cells)
        and archived == checksums
    )


def _check_inputs(results: Path, cells: list[str]) -> None:
    for cell in cells:
        src = results / cell
        if not src.is_dir():
            raise ResultError(
                src,
                "(cell folder)",
                "(absent)",
                f"the results of cell {cell}",
                f"snakemake --cores 2 {src}/gsm8k/tuned.json (with your --configfile, if any)",
            )
        for path in stage_results(src) + gate_result(src):
            if path.exists():
                load_result(path, results)
        for tsv in job_times.benchmark_files(results, cell):
            try:  # the jobs' walls travel with the cell (a later `cellbench plan` reads them)
                job_times.read_benchmark_seconds(tsv)
            except job_times.JobTimeError as exc:
                raise ResultError(
                    tsv, "s", "(unreadable)", f"a Snakemake benchmark file ({exc})",
                    "the cell's job of that name (snakemake --forcerun), or delete the file",
                ) from exc  # fmt: skip
    # A run archived without one of its results would verify as whole later on.
    whole_sets.check_whole(results, cells)


def _read_only(root: Path) -> None:
    """Files of a finished run folder lose their write bits: a stray write fails loudly."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, path.stat().st_mode & ~0o222)


def point_latest(label_dir: Path, run: str) -> None:
    """Make ``label_dir/latest`` point at ``run`` in one step (a new link renamed over it)."""
    tmp = label_dir / f".{LATEST}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    os.symlink(run, tmp)
    try:
        os.replace(tmp, label_dir / LATEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass
class Archived:
    label: str
    run: str
    added: bool
    manifest: dict = field(repr=False)


def build_run(
    label: str,
    results: Path,
    cells: list[str],
    digests: dict[str, str],
    config_hash: str,
    archive_root: Path = DEFAULT_ROOT,
    runtime: str = "docker",
) -> Archived:
    """Archive the cells' results as a new run of ``label``, or find that very run archived.

    Every result is checked first; a bad or missing one raises ``ResultError`` (naming the file
    in ``results``) before anything is written. A new run is copied with its report into a
    temporary folder, its MANIFEST.json written, then renamed to ``{label}/{run}``; ``latest``
    moves to it (or to the run found), and ``ARCHIVED.json`` is written last."""
    results, archive_root = Path(results), Path(archive_root)
    label_dir = archive_root / label
    _check_inputs(results, cells)
    commit = git_state(paths.REPO_DIR)
    checksums = _cell_checksums(results, cells)
    for run in runs(archive_root, label):
        manifest = read_manifest(run.path)
        if manifest and _same_run(
            manifest, digests, config_hash, commit["commit"], cells, checksums
        ):
            point_latest(label_dir, run.name)
            _write_receipt(label_dir, run.name, added=False)
            return Archived(label, run.name, False, manifest)
    created = datetime.now(UTC).replace(microsecond=0)
    name, suffix = run_name(created, digests), 1
    while (label_dir / name).exists():  # two archives in one second: never reuse a folder
        suffix += 1
        name = f"{run_name(created, digests)}-{suffix}"
    staging = atomicio.staging_dir(label_dir, f".{name}.")
    try:
        _stage_cells(results, staging, cells)
        _stage_report(staging, cells, runtime, f"{label}/{name}", digests)
        files = {
            str(p.relative_to(staging)): sha256_file(p)
            for p in sorted(staging.rglob("*"))
            if p.is_file()
        }
        manifest = {
            "kind": "archive_run",
            "label": label,
            "run": name,
            "created": created.isoformat(),
            "runtime": runtime,
            "cells": cells,
            "images": digests,
            "environment": environment(),
            "git": commit,
            "config_sha256": config_hash,
            **_measured_and_versions(results, cells),
            "files": files,
        }
        atomicio.write_json(staging / MANIFEST_NAME, manifest)
        _read_only(staging)
        final = label_dir / name
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    point_latest(label_dir, final.name)
    _write_receipt(label_dir, final.name, added=True)
    return Archived(label, final.name, True, manifest)


def _stage_cells(results: Path, staging: Path, cells: list[str]) -> None:
    """Each cell's results copied into ``staging``, with its jobs' benchmark files at the
    same place (benchmarks/<cell>/): history for `cellbench plan` (config.cost) once
    results/ no longer has them."""
    for cell in cells:
        shutil.copytree(results / cell, staging / cell, ignore=_temporary)
        for tsv in job_times.benchmark_files(results, cell):
            (staging / tsv.relative_to(results)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tsv, staging / tsv.relative_to(results))


def _stage_report(
    staging: Path, cells: list[str], runtime: str, run: str, digests: dict[str, str]
) -> None:
    """The staged run's own figures (the same plots code as the live report), then its
    report, both from the staged copies."""
    inputs = [
        p for cell in cells for p in stage_results(staging / cell) + gate_result(staging / cell)
    ]
    for cell in cells:
        plots.draw_cell(staging, cell, plots.plot_dir(staging, cell))
    report.write_report(
        inputs,
        staging / "report",
        results=staging,
        runtime=runtime,
        run=run,
        digests=digests,
    )


def _measured_and_versions(results: Path, cells: list[str]) -> dict[str, Any]:
    """The manifest's measurement window and every side's package versions."""
    return {
        "measured": measurement_window(results, cells),
        # Host side: Snakemake, the load generator, lm-eval, the report.
        "host_packages": package_versions(),
        # The tuner's versions, as it read them where it ran (the image on docker).
        "tuner_packages": tuner_packages(results, cells),
        # The servers' own: asked of the server's interpreter (local runtime), and
        # vLLM's GET /version answer, per cell and arm, as bench.json recorded them.
        "server_packages": {cell: server_packages(results, cell) for cell in cells},
        # What each arm's server said it was while it ran (GET /version), per cell.
        "server_versions": {cell: server_versions(results, cell) for cell in cells},
    }


def _write_receipt(label_dir: Path, run: str, added: bool) -> None:
    atomicio.write_json(
        label_dir / RECEIPT_NAME,
        {
            "kind": "archive_receipt",
            "label": label_dir.name,
            "run": run,
            "added": added,
            "written": datetime.now(UTC).isoformat(timespec="seconds"),
            "manifest_sha256": sha256_file(label_dir / run / MANIFEST_NAME),
        },
    )


# --- command line ------------------------------------------------------------------------


def _print_list(archive_root: Path) -> int:
    found = runs(archive_root)
    if not found:
        print(f"no archived run in {archive_root}")
        return 0
    print("label\trun\tcreated\tcells\tdigests\tfiles")
    unreadable = []
    for run in found:
        m = read_manifest(run.path)
        if m is None:
            # Not a row of question marks: a run whose manifest cannot be read is damaged.
            print(f"{run.label}\t{run.name}\tUNREADABLE: {_manifest_problem(run.path)}")
            unreadable.append(run.ref)
            continue
        digests = ",".join(f"{k}={v}" for k, v in sorted(m.get("images", {}).items()))
        latest = (
            os.readlink(run.path.parent / LATEST)
            if (run.path.parent / LATEST).is_symlink()
            else None
        )
        mark = " (latest)" if latest == run.name else ""
        print(
            f"{run.label}\t{run.name}{mark}\t{m.get('created', '?')}\t{len(m.get('cells', []))}"
            f"\t{digests or 'n/a'}\t{len(m.get('files', {}))}"
        )
    if unreadable:
        print(
            f"{len(unreadable)} run(s) with an unreadable {MANIFEST_NAME}: "
            f"{', '.join(unreadable)}; check them: cellbench archive verify RUN",
            file=sys.stderr,
        )
        return 1
    return 0


def _manifest_problem(run_dir: Path) -> str:
    """Why a run's manifest cannot be read, in a few words."""
    path = run_dir / MANIFEST_NAME
    try:
        json.loads(path.read_text())
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    except ValueError:
        return f"{path} is not whole JSON"
    return f"{path} is not a JSON object"


def format_manifest(run: Run, m: dict) -> str:
    git = m.get("git") or {}
    window = m.get("measured") or {}
    lines = [
        f"run:        {run.ref}",
        f"created:    {m.get('created', '?')}",
        f"runtime:    {m.get('runtime', '?')}",
        f"git:        {git.get('commit')}" + (" (dirty)" if git.get("dirty") else ""),
        f"config:     sha256 {m.get('config_sha256')}",
        f"measured:   {window.get('start')} .. {window.get('end')}"
        + (f" (from {', '.join(window.get('read_from', []))})" if window.get("read_from") else ""),
        "images:",
        *[f"  {k}: {v}" for k, v in sorted(m.get("images", {}).items())],
        "cells:",
    ]
    for cell in m.get("cells", []):
        # Manifests from before the rename hold the tuner's versions as measured_packages.
        pk = (m.get("tuner_packages") or m.get("measured_packages") or {}).get(cell, {})
        versions = ", ".join(f"{k} {v}" for k, v in pk.items() if k != "read_from" and v)
        lines.append(f"  {cell}: tuner: {versions or 'no versions recorded'}")
        for arm, seen in sorted(((m.get("server_packages") or {}).get(cell) or {}).items()):
            said = ", ".join(
                f"{k} {v}"
                for k, v in seen.items()
                if k in ("python", "torch", "triton", "transformers", "vllm") and v
            )
            if said:
                lines.append(f"    {arm} server's environment: {said}")
        served = (m.get("server_versions") or {}).get(cell) or {}
        if served:
            said = ", ".join(f"{arm} {v or 'n/a'}" for arm, v in sorted(served.items()))
            lines.append(f"    servers said (GET /version): {said}")
    env = m.get("environment") or {}
    lines += [
        f"host:       {env.get('platform')} ({env.get('machine')}), Python {env.get('python')}"
    ]
    host = m.get("host_packages") or {}
    lines.append("host packages: " + ", ".join(f"{k} {v}" for k, v in host.items() if v))
    files = m.get("files", {})
    lines.append(f"files ({len(files)}):")
    lines += [f"  {digest[:16]}  {name}" for name, digest in files.items()]
    return "\n".join(lines)


def _verify(archive_root: Path, ref: str | None) -> int:
    targets = [resolve(archive_root, ref)] if ref else runs(archive_root)
    if not targets:
        print(f"no archived run in {archive_root}")
        return 0
    bad = 0
    for run in targets:
        check = check_run(run.path)
        if check.ok():
            n = len((read_manifest(run.path) or {}).get("files", {}))
            print(f"ok\t{run.ref}\t{n} files match")
            continue
        bad += 1
        if check.manifest_unreadable:
            print(f"FAILED\t{run.ref}\t{MANIFEST_NAME} missing or unreadable")
        for kind, names in (
            ("changed", check.changed),
            ("missing", check.missing),
            ("extra", check.extra),
        ):
            for name in names:
                print(f"FAILED\t{run.ref}\t{kind}: {name}")
    if bad:
        print(f"{bad} of {len(targets)} runs differ from their manifests", file=sys.stderr)
    return 1 if bad else 0


def _build(args: argparse.Namespace) -> int:
    digests = dict(item.split("=", 1) for item in args.digests)
    runtime = args.runtime or (
        "local" if all(d.startswith("local:") for d in digests.values()) else "docker"
    )
    label_dir = args.archive_root / args.label
    try:
        done = build_run(
            args.label,
            args.results,
            args.cells,
            digests,
            args.config_hash,
            args.archive_root,
            runtime,
        )
    except ResultError as exc:
        print(f"cellbench archive: error: {exc}", file=sys.stderr)
        print(f"cellbench archive: {_kept(label_dir)}", file=sys.stderr)
        return 1
    except BaseException:
        print(f"cellbench archive: failed; {_kept(label_dir)}", file=sys.stderr)
        raise
    where = label_dir / done.run
    if done.added:
        n = len(done.manifest["files"])
        print(f"archived {n} files of {len(args.cells)} cells as a new run: {where}")
    else:
        print(
            f"already archived: {where} holds these very results (same digests, config hash, "
            "commit and result checksums); nothing added"
        )
    return 0


def _kept(label_dir: Path) -> str:
    earlier = runs(label_dir.parent, label_dir.name) if label_dir.is_dir() else []
    if not earlier:
        return f"no run was archived, and there was none before in {label_dir}"
    return f"no run was added; {label_dir} keeps its earlier runs ({len(earlier)}) as they were"


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--archive-root", type=Path, default=DEFAULT_ROOT, help=f"default: {DEFAULT_ROOT}"
    )
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.archive",
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", parents=[common], help="archive the cells' results as a run")
    build.add_argument("--label", required=True)
    build.add_argument("--results", default="results", type=Path)
    build.add_argument("--cells", nargs="+", required=True)
    build.add_argument("--digests", nargs="+", default=[], help="IMAGE=DIGEST")
    build.add_argument("--config-hash", required=True)
    build.add_argument("--runtime", choices=["docker", "local"])
    sub.add_parser("list", parents=[common], help="one line per archived run")
    show = sub.add_parser("show", parents=[common], help="a run's manifest, readable")
    show.add_argument("run")
    show.add_argument("--json", action="store_true", help="the manifest as it is")
    check = sub.add_parser("verify", parents=[common], help="recompute every checksum")
    check.add_argument("run", nargs="?")
    diff = sub.add_parser("diff", parents=[common], help="compare the cells two runs hold")
    diff.add_argument("run_a")
    diff.add_argument("run_b")
    args = parser.parse_args(argv)
    root = args.archive_root
    try:
        if args.command == "build":
            return _build(args)
        if args.command == "list":
            return _print_list(root)
        if args.command == "show":
            run = resolve(root, args.run)
            manifest = read_manifest(run.path)
            if manifest is None:
                raise ArchiveError(f"{run.path / MANIFEST_NAME} is missing or not JSON")
            print(json.dumps(manifest, indent=2) if args.json else format_manifest(run, manifest))
            return 0
        if args.command == "verify":
            return _verify(root, args.run)
        print(diff_runs(root, args.run_a, args.run_b))
        return 0
    except ArchiveError as exc:
        print(f"cellbench archive: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an unreadable run or folder: the user's to fix, one line
        where = exc.filename or root
        print(f"cellbench archive: error: cannot read {where}: {exc.strerror or exc}",
              file=sys.stderr)  # fmt: skip
        return 2


if __name__ == "__main__":
    sys.exit(main())
