"""Copy a finished run into an archive keyed by ROCm version, with a manifest.

The manifest pins the run down: the image digest of each cell (or, for the local runtime, the
host environment), the git commit of this project, the config hash, the versions of the
packages that shaped the numbers (read where they ran: inside the image for the tuner and
server, on the host for the load generator and lm-eval), and the sha256 of every archived file.
The archive is built in a temporary folder and put in place whole (INDEX.json, the rule's
output, written last), so an interrupted or failed archive never looks complete and never costs
the previous one. Every result is checked through `cellbench.results` before it is copied.

    python -m cellbench.archive --label rocm7.2 --results results --cells CELL... \
        --digests IMAGE=DIGEST... --config-hash H --out-dir results/archive/rocm7.2
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from cellbench import atomicio, report
from cellbench.atomicio import sha256_file
from cellbench.results import ResultError
from cellbench.results import load as load_result

MANIFEST_NAME = "MANIFEST.json"

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


def git_state(repo: Path) -> dict[str, str | bool | None]:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def environment() -> dict[str, str]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
    }


INDEX_NAME = "INDEX.json"


def measured_packages(results: Path, cells: list[str]) -> dict[str, dict[str, str | None]]:
    """Per cell, the versions that shaped its numbers, as the tuner read them where it ran
    (inside the image on the docker runtime, where the server runs too): its tune summary's
    torch, Triton, vLLM and Python. The host's own versions are ``host_packages``."""
    out = {}
    for cell in cells:
        summary = load_result(results / cell / "tune" / "summary.json", results).data
        out[cell] = {
            "read_from": f"{cell}/tune/summary.json",
            "platform": summary.get("platform"),
            **{k: summary.get(f"{k}_version") for k in ("torch", "triton", "vllm", "python")},
        }
    return out


def stage_results(cell_dir: Path) -> list[Path]:
    """A cell's stage results: what the archive checks and its report reads."""
    return sorted(
        [cell_dir / "tune" / "summary.json"]
        + list(cell_dir.glob("serve/*/bench.json"))
        + list(cell_dir.glob("gsm8k/*.json"))
    )


def build_archive(
    label: str,
    results: Path,
    cells: list[str],
    digests: dict[str, str],
    config_hash: str,
    out_dir: Path,
    runtime: str,
) -> dict:
    """Check the cells' results, copy them with their report into a temporary folder, write
    MANIFEST.json, then INDEX.json (the rule's output), and only then put the folder in
    ``out_dir``'s place. A bad or missing result raises ``ResultError`` (naming the file in
    ``results``, not its copy) and leaves any earlier archive as it was."""
    results, out_dir = Path(results), Path(out_dir)
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
        for path in stage_results(src):
            load_result(path, results)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = atomicio.staging_dir(out_dir.parent, f".{out_dir.name}.")
    try:
        for cell in cells:
            shutil.copytree(results / cell, staging / cell)
        inputs = [p for cell in cells for p in stage_results(staging / cell)]
        report.write_report(inputs, staging / "report", results=staging, runtime=runtime)
        files = {
            str(p.relative_to(staging)): sha256_file(p)
            for p in sorted(staging.rglob("*"))
            if p.is_file()
        }
        manifest = {
            "label": label,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "runtime": runtime,
            "cells": cells,
            "images": digests,
            "environment": environment(),
            "git": git_state(Path(__file__).resolve().parents[2]),
            "config_sha256": config_hash,
            # Host side: Snakemake, the load generator, lm-eval, the report.
            "host_packages": package_versions(),
            # Where the numbers were measured (the image on docker), read there.
            "measured_packages": measured_packages(results, cells),
            "files": files,
        }
        atomicio.write_json(staging / MANIFEST_NAME, manifest)
        index = {
            "kind": "archive_index",
            "label": label,
            "written": manifest["created"],
            "manifest_sha256": sha256_file(staging / MANIFEST_NAME),
            "files": len(files),
        }
        atomicio.write_json(staging / INDEX_NAME, index)  # last: the rule's output
        atomicio.replace_dir(staging, out_dir)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _kept(out_dir: Path) -> str:
    manifest = out_dir / MANIFEST_NAME
    try:
        created = json.loads(manifest.read_text()).get("created", "?")
    except (OSError, ValueError):
        return f"no archive was written, and there was no complete one before in {out_dir}"
    return f"the previous archive was kept: {out_dir} (MANIFEST.json created {created})"


def verify(manifest_path: Path) -> list[str]:
    """Files whose sha256 no longer matches the manifest (empty when the archive is intact)."""
    manifest = json.loads(manifest_path.read_text())
    root = manifest_path.parent
    return [
        name
        for name, digest in manifest["files"].items()
        if not (root / name).is_file() or sha256_file(root / name) != digest
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.archive",
        allow_abbrev=False,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--label", required=True)
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--cells", nargs="+", required=True)
    parser.add_argument("--digests", nargs="+", default=[], help="IMAGE=DIGEST")
    parser.add_argument("--config-hash", required=True)
    parser.add_argument("--runtime", choices=["docker", "local"])
    parser.add_argument(
        "--out-dir", required=True, type=Path, help="results/archive/LABEL (replaced whole)"
    )
    args = parser.parse_args(argv)
    digests = dict(item.split("=", 1) for item in args.digests)
    runtime = args.runtime or (
        "local" if all(d.startswith("local:") for d in digests.values()) else "docker"
    )
    try:
        manifest = build_archive(
            args.label, args.results, args.cells, digests, args.config_hash, args.out_dir, runtime
        )
    except ResultError as exc:
        print(f"cellbench archive: error: {exc}", file=sys.stderr)
        print(f"cellbench archive: {_kept(args.out_dir)}", file=sys.stderr)
        return 1
    except BaseException:
        print(f"cellbench archive: failed; {_kept(args.out_dir)}", file=sys.stderr)
        raise
    print(f"archived {len(manifest['files'])} files of {len(args.cells)} cells to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
