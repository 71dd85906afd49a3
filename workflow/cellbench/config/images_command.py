"""``cellbench images lock|bump NAME|status``: the image pins' command line.

It loads the config (this layer) and hands the work to ``cellbench.runtime.images``, which holds
no config code of its own, so the runtime layer never imports the config layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cellbench.config import loader as cbconfig
from cellbench.runtime import images

DESCRIPTION = "Pin configured images by digest, pull them, and say when a tag has moved."
EPILOG = (
    "exit status: 0 all as pinned; 2 bad input or an error (the message says which); "
    "3 status: a tag is not as pinned (moved, unpinned, ref changed); "
    "4 the registry could not be reached (nothing is known about its tags)"
)


def _load_config(path: str) -> dict[str, Any]:
    try:
        return cbconfig.load(path)
    except cbconfig.ConfigError as exc:
        raise images.ImageError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """``cellbench images lock|bump NAME|status [--configfile F] [--lock F]``."""
    # The options are accepted before or after the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--configfile",
        default=argparse.SUPPRESS,
        help="config file (default: config/local.yaml, as `cellbench cells` and the profile)",
    )
    common.add_argument(
        "--lock", default=argparse.SUPPRESS, help="lock file (default: the config's image_lock)"
    )
    parser = argparse.ArgumentParser(
        prog="cellbench images", parents=[common], description=DESCRIPTION, epilog=EPILOG
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("lock", parents=[common], help="pin every configured image without a pin")
    bump = sub.add_parser(
        "bump", parents=[common], help="move one image's pin to its tag's current digest"
    )
    bump.add_argument("name")
    sub.add_parser(
        "status", parents=[common], help="say, per image, whether its tag moved since it was pinned"
    )
    args = parser.parse_args(argv)
    # The same default as `cellbench cells` and the default profile (config/local.yaml).
    args.configfile = getattr(args, "configfile", "config/local.yaml")
    args.lock = getattr(args, "lock", None)
    out = sys.stdout
    try:
        cfg = _load_config(args.configfile)
        if cfg["runtime"] != "docker":
            # Nothing to pin: the local runtime runs host processes, never an image.
            raise images.ImageError(
                f"{args.configfile} has runtime: {cfg['runtime']}, which runs no image, so "
                "there is nothing to pin; give a docker config (--configfile config/config.yaml)"
            )
        lock_path = Path(args.lock or cfg.get("image_lock", "config/images.lock.yaml"))
        images.load_lock(lock_path)  # bad input fails before the engine is contacted
        if args.cmd == "bump" and args.name not in cfg["images"]:
            known = ", ".join(sorted(cfg["images"]))
            raise images.ImageError(
                f"image {args.name!r} is not defined under images (known: {known})"
            )
        client = images.docker_client()
        if args.cmd == "lock":
            return images.cmd_lock(cfg, lock_path, client, out)
        if args.cmd == "bump":
            return images.cmd_bump(cfg, lock_path, args.name, client, out)
        return images.cmd_status(cfg, lock_path, client, out)
    except images.RegistryUnreachable as exc:
        print(f"cellbench images: error: {exc}", file=sys.stderr)
        return images.EXIT_UNREACHABLE
    except images.ImageError as exc:
        print(f"cellbench images: error: {exc}", file=sys.stderr)
        return images.EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
