"""The `cellbench` command: cells, shapes, tune and images, outside Snakemake.

Each subcommand forwards to the module that owns the stage, so the Snakemake rules and this
CLI run the same code.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from importlib import import_module

from cellbench import __version__
from cellbench.config import ceiling
from cellbench.config import loader as cbconfig

# The config every subcommand reads without --configfile: the one the default workflow
# profile (profiles/default) hands to Snakemake, so `cellbench` and `snakemake` agree.
DEFAULT_CONFIGFILE = "config/local.yaml"

# subcommand -> (module, help); the module's main(argv) -> int does the work.
FORWARDED = {
    "plan": ("cellbench.config.cost", "estimate wall time and GPU-hours before a run"),
    "shapes": ("cellbench.tune.shapes", "fused-MoE shapes and vLLM config file name of a model"),
    "tune": ("cellbench.tune.cli", "tune the fused-MoE kernel for one shape"),
    "images": ("cellbench.config.images_command", "pin images by digest: lock, bump NAME, status"),
    "archive": ("cellbench.archive.write", "archived runs: list, show RUN, verify [RUN], diff A B"),
    "watch": ("cellbench.watch.watch", "follow moved tags: bump, run, archive, history, verdict"),
    "bisect": ("cellbench.watch.bisect", "find the first bad image between a good and a bad one"),
    "history": ("cellbench.watch.page", "a ROCm version's history page with its change points"),
    "tidy": (
        "cellbench.report.tidy",
        "one tidy table (Parquet, CSV) of live results or an archived run",
    ),
}


def _cells(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cellbench cells", description="List the cells of a config and their targets."
    )
    parser.add_argument(
        "--configfile",
        default=DEFAULT_CONFIGFILE,
        help=f"config file (default: {DEFAULT_CONFIGFILE}, as the default profile)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        cfg = cbconfig.load(args.configfile)
        ceiling.check_config(cfg)  # as the workflow does: what would run must be affordable
    except cbconfig.ConfigError as exc:
        print(f"cellbench: {exc}", file=sys.stderr)
        return 2
    cells = cbconfig.cells(cfg)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "image": c.image,
                        "model": c.model,
                        "tp": c.tp,
                        "ep": c.ep,
                        "path": c.path,
                        "targets": c.targets(),
                    }
                    for c in cells
                ],
                indent=2,
            )
        )
        return 0
    print(f"{len(cells)} cells in {args.configfile} (runtime: {cfg['runtime']})")
    for c in cells:
        print(f"\n{c.cell_id}")
        for target in c.targets():
            print(f"  {target}")
    if cells:
        print("\nRun one cell:\n  " + run_one_cell_command(args.configfile, cfg, cells[0]))
    return 0


def _cell_ids(configfile: str | None) -> list[str]:
    """The cells of a config file (the default one for None); ValueError names a bad one."""
    try:
        cfg = cbconfig.load(configfile or DEFAULT_CONFIGFILE)
    except cbconfig.ConfigError as exc:
        raise ValueError(str(exc)) from None
    return [cell.cell_id for cell in cbconfig.cells(cfg)]


def run_one_cell_command(configfile: str, cfg: dict, cell: cbconfig.Cell) -> str:
    """The Snakemake line that runs one cell. Targets come first: Snakemake reads every word
    after --configfile as one more config file, and after --resources as one more resource."""
    words = [".venv/bin/snakemake", *cell.targets(), "--cores", "2"]
    if cfg["runtime"] == "docker":  # the profile counts no GPUs; say how many there are
        words += ["--resources", f"gpu={cfg['gpus']}"]
    return shlex.join([*words, "--configfile", configfile])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "cells": "list cells and their Snakemake targets",
        **{k: v[1] for k, v in FORWARDED.items()},
    }
    if argv and argv[0] == "--version":
        print(f"cellbench {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: cellbench [--version] {" + ",".join(commands) + "} ...\n")
        for name, text in commands.items():
            print(f"  {name:8s} {text}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "cells":
        return _cells(rest)
    if command == "tidy":  # live results are checked against a config's cells
        return int(import_module(FORWARDED[command][0]).main(rest, config_cells=_cell_ids))
    if command in FORWARDED:
        return int(import_module(FORWARDED[command][0]).main(rest) or 0)
    print(
        f"cellbench: unknown command {command!r} (choose from {', '.join(commands)})",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
