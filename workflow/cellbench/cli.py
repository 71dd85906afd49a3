"""The `cellbench` command: cells, shapes, tune and images, outside Snakemake.

Each subcommand forwards to the module that owns the stage, so the Snakemake rules and this
CLI run the same code.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import import_module

from cellbench import config as cbconfig

# subcommand -> (module, help); the module's main(argv) -> int does the work.
FORWARDED = {
    "shapes": ("cellbench.shapes", "fused-MoE shapes and vLLM config file name of a model"),
    "tune": ("cellbench.tuner.cli", "tune the fused-MoE kernel for one shape"),
    "images": ("cellbench.images", "pin images by digest: lock, bump NAME, status"),
}


def _cells(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cellbench cells", description="List the cells of a config and their targets."
    )
    parser.add_argument("--configfile", default="config/local.yaml")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        cfg = cbconfig.load(args.configfile)
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
    print(
        "\nRun one cell: snakemake --cores 2 --configfile "
        + args.configfile
        + " "
        + " ".join(cells[0].targets())
        if cells
        else ""
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "cells": "list cells and their Snakemake targets",
        **{k: v[1] for k, v in FORWARDED.items()},
    }
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: cellbench {" + ",".join(commands) + "} ...\n")
        for name, text in commands.items():
            print(f"  {name:8s} {text}")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "cells":
        return _cells(rest)
    if command in FORWARDED:
        return int(import_module(FORWARDED[command][0]).main(rest) or 0)
    print(
        f"cellbench: unknown command {command!r} (choose from {', '.join(commands)})",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
