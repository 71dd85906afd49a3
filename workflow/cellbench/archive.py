"""Copy a finished run into an archive keyed by ROCm version, with a manifest.

The manifest pins the run down: the image digest of each cell (or, for the local runtime, the
host environment), the git commit of this project, the config hash, the versions of the
packages that shaped the numbers, and the sha256 of every archived file. The archive is built
in a temporary folder and renamed into place, so an interrupted archive never looks complete.

    python -m cellbench.archive --label rocm7.2 --results results --cells CELL... \
        --digests IMAGE=DIGEST... --config-hash H --out results/archive/rocm7.2/MANIFEST.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from cellbench import atomicio, report

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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def build_archive(
    label: str,
    results: Path,
    cells: list[str],
    digests: dict[str, str],
    config_hash: str,
    out_manifest: Path,
    runtime: str,
) -> dict:
    final_dir = out_manifest.parent
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = atomicio.staging_dir(final_dir.parent, f".{label}.")
    try:
        for cell in cells:
            src = results / cell
            if not src.is_dir():
                raise FileNotFoundError(f"cell {cell}: no results at {src}")
            shutil.copytree(src, staging / cell)
        inputs = sorted(
            p
            for p in staging.rglob("*.json")
            if p.name in ("bench.json", "summary.json") or p.parent.name == "gsm8k"
        )
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
            "packages": package_versions(),
            "files": files,
        }
        atomicio.write_json(staging / out_manifest.name, manifest)
        # Swap in the new archive: the old one (if any) goes only once the new one is whole.
        old = None
        if final_dir.exists():
            old = final_dir.with_name(f".{label}.old")
            shutil.rmtree(old, ignore_errors=True)
            final_dir.rename(old)
        staging.rename(final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def verify(manifest_path: Path) -> list[str]:
    """Files whose sha256 no longer matches the manifest (empty when the archive is intact)."""
    import json

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
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--label", required=True)
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--cells", nargs="+", required=True)
    parser.add_argument("--digests", nargs="+", default=[], help="IMAGE=DIGEST")
    parser.add_argument("--config-hash", required=True)
    parser.add_argument("--runtime", choices=["docker", "local"])
    parser.add_argument("--out", required=True, type=Path, help=".../MANIFEST.json")
    args = parser.parse_args(argv)
    digests = dict(item.split("=", 1) for item in args.digests)
    runtime = args.runtime or (
        "local" if all(d.startswith("local:") for d in digests.values()) else "docker"
    )
    manifest = build_archive(
        args.label, args.results, args.cells, digests, args.config_hash, args.out, runtime
    )
    print(
        f"archived {len(manifest['files'])} files of {len(args.cells)} cells to {args.out.parent}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
