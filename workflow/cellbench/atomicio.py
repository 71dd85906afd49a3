"""Atomic file writes for host-side stages: a reader sees the old file or the whole new one.

A temporary file in the same folder is written, flushed to disk, then renamed over the target,
so a job killed half-way never leaves an output that looks complete. The file gets the mode a
plain ``open()`` would give it (0666 less the umask): ``mkstemp`` makes it 0600, and a rename
keeps that, which would leave results unreadable to colleagues.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_mode(fd: int, *, executable: bool = False) -> None:
    """Give a temporary file the mode a new file would have under the current umask."""
    os.fchmod(fd, (0o777 if executable else 0o666) & ~_umask())


def write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            publish_mode(f.fileno())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def staging_dir(parent: str | Path, prefix: str) -> Path:
    """A new temporary folder in ``parent`` (same file system, so it can be renamed into
    place), with the mode a plain ``mkdir`` would give it rather than mkdtemp's 0700."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path
