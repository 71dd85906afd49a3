"""The commit and dirty flag of the tree a report or archive was made from.

A checkout answers through git, but only for itself: ``git -C DIR`` in a copy without ``.git``
would answer for whatever repository holds the copy, or fail. A copy made to run elsewhere
(the tree copied to another machine) therefore carries ``.cellbench-tree.json``, written into
it before it leaves (``write_tree_file``, or ``python -m cellbench.common.gitstate stamp DEST``)
with the commit and dirty flag of the checkout it was copied from. ``git_state`` prefers the
tree's own git, then that file, else gives nulls with the reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from cellbench.common.atomicio import write_json

TREE_FILE = ".cellbench-tree.json"


def _git(repo: Path, *args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _own_git(repo: Path) -> dict[str, str | bool | None] | None:
    """The checkout's own commit and dirty flag, or None when ``repo`` is not the top of a git
    work tree (a copy inside some other repository answers for that one: not ours)."""
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(repo).resolve():
        return None
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return {
        "commit": _git(repo, "rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "source": "git",
    }


def git_state(repo: Path) -> dict[str, str | bool | None]:
    """``commit``, ``dirty`` and ``source`` (``git``, or the tree file's name) of the tree at
    ``repo``; on a tree with neither, nulls and ``reason``."""
    repo = Path(repo)
    own = _own_git(repo)
    if own is not None:
        return own
    path = repo / TREE_FILE
    try:
        stamp = json.loads(path.read_text())
    except FileNotFoundError:
        return {
            "commit": None,
            "dirty": None,
            "source": None,
            "reason": f"{repo} is not a git checkout and holds no {TREE_FILE}",
        }
    except (OSError, ValueError) as exc:
        return {
            "commit": None,
            "dirty": None,
            "source": None,
            "reason": f"{path} cannot be read as JSON: {exc}",
        }
    commit = stamp.get("commit") if isinstance(stamp, dict) else None
    if not isinstance(commit, str) or not commit:
        return {"commit": None, "dirty": None, "source": None, "reason": f"{path} names no commit"}
    return {
        "commit": commit,
        "dirty": stamp.get("dirty"),
        "source": TREE_FILE,
        "copied_from": stamp.get("copied_from"),
        "written": stamp.get("written"),
    }


def write_tree_file(repo: Path, dest: Path) -> dict[str, str | bool | None]:
    """Write ``dest/.cellbench-tree.json``: the commit and dirty flag of checkout ``repo`` (its
    own git, or its own tree file when it is a copy itself), atomically. Raises ValueError
    when ``repo`` knows no commit."""
    state = git_state(Path(repo))
    if not state.get("commit"):
        raise ValueError(f"no commit to write: {state.get('reason')}")
    stamp = {
        "commit": state["commit"],
        "dirty": state["dirty"],
        "copied_from": str(Path(repo).resolve()),
        "written": datetime.now(UTC).replace(microsecond=0).isoformat(),
    }
    write_json(Path(dest) / TREE_FILE, stamp)
    return stamp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cellbench.common.gitstate",
        description="The commit of a tree; stamp a copy of it before it leaves.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stamp", help=f"write DEST/{TREE_FILE} from the checkout --repo")
    st.add_argument("dest", type=Path)
    st.add_argument("--repo", type=Path, default=Path("."))
    sh = sub.add_parser("show", help="print the commit git_state finds for a tree")
    sh.add_argument("tree", type=Path, nargs="?", default=Path("."))
    args = ap.parse_args(argv)
    if args.cmd == "stamp":
        try:
            stamp = write_tree_file(args.repo, args.dest)
        except (ValueError, OSError) as exc:
            print(f"gitstate: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.dest / TREE_FILE}: {stamp['commit']} (dirty: {stamp['dirty']})")
        return 0
    print(json.dumps(git_state(args.tree), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
