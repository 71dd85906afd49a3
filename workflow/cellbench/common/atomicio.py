"""Atomic file writes for host-side stages: a reader sees the old file or the whole new one.

A temporary file in the same folder is written, flushed to disk, then renamed over the target,
so a job killed half-way never leaves an output that looks complete. The file gets the mode a
plain ``open()`` would give it (0666 less the umask): ``mkstemp`` makes it 0600, and a rename
keeps that, which would leave results unreadable to colleagues.

``checksum=True`` also records the file's sha256 in a sidecar ``NAME.sha256`` (the format
``sha256sum -c`` reads), so a reader can tell a result that changed after it was written
(``cellbench.results.loaders`` verifies it). Standard library only: the tuner uses this in the
image.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
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


# Folders handed as they are to another program, which must hold only that program's files:
# ``tune/configs/`` becomes vLLM's VLLM_TUNED_CONFIG_FOLDER and is what a user copies into
# vLLM's own configs folder for a pull request. Their files' sidecars live in a sibling
# ``configs.sha256/`` instead.
CLEAN_FOLDERS = frozenset({"configs"})


def checksum_path(path: str | Path) -> Path:
    """The sidecar that holds ``path``'s sha256: ``NAME.sha256`` beside it, or in
    ``FOLDER.sha256/`` beside the folder for a file in one of CLEAN_FOLDERS."""
    path = Path(path)
    if path.parent.name in CLEAN_FOLDERS:
        return path.parent.with_name(path.parent.name + ".sha256") / (path.name + ".sha256")
    return path.with_name(path.name + ".sha256")


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recorded_checksum(path: str | Path) -> str | None:
    """The sha256 recorded for ``path`` when it was written, or None if none was recorded."""
    side = checksum_path(path)
    try:
        text = side.read_text()
    except FileNotFoundError:
        return None
    return text.split()[0] if text.split() else ""


def write_bytes(path: str | Path, data: bytes, *, checksum: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if checksum:
        # A stale sidecar must not outlive the file it described; if we die before the new
        # one is written, the file reads as "no checksum recorded", never as a wrong one.
        checksum_path(path).unlink(missing_ok=True)
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
    if checksum:
        digest = hashlib.sha256(data).hexdigest()
        side = checksum_path(path)
        name = path.name if side.parent == path.parent else os.path.relpath(path, side.parent)
        write_bytes(side, f"{digest}  {name}\n".encode())


def write_text(path: str | Path, text: str, *, checksum: bool = False) -> None:
    write_bytes(path, text.encode(), checksum=checksum)


def write_json(path: str | Path, obj: Any, *, checksum: bool = False) -> None:
    text = json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"
    write_text(path, text, checksum=checksum)


def tree_checksum_path(folder: str | Path) -> Path:
    """The sidecar of a whole folder of results (lm-eval's output): ``FOLDER.sha256`` beside
    it, one ``sha256  relative/path`` line per file (what ``sha256sum -c`` reads from inside
    the folder)."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".sha256")


def _tree_digests(folder: Path) -> dict[str, str]:
    """Every file's sha256 but dot names: Snakemake's ``.snakemake_timestamp`` in a folder
    output, temporary files of writes under way (as the archive's copies leave them out)."""
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and not p.is_symlink()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }


def write_tree_checksum(folder: str | Path) -> None:
    """Record the sha256 of every file under ``folder`` in its sidecar (written atomically)."""
    lines = [f"{digest}  {name}\n" for name, digest in _tree_digests(Path(folder)).items()]
    write_text(tree_checksum_path(folder), "".join(lines))


def tree_problem(folder: str | Path) -> str | None:
    """Why ``folder`` no longer holds what its writer recorded (a missing sidecar, a file
    changed, gone or added), or None when every file matches."""
    folder, side = Path(folder), tree_checksum_path(folder)
    try:
        text = side.read_text()
    except FileNotFoundError:
        return f"no checksum recorded ({side.name} is missing)"
    recorded = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        recorded[name] = digest
    found = _tree_digests(folder)
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            return f"{name} is gone since {side.name} was recorded"
        if name not in recorded:
            return f"{name} is not in {side.name} (added after it was recorded)"
        if found[name] != recorded[name]:
            return f"{name} changed after it was written (sha256 recorded in {side.name})"
    return None


def publish_tree(root: str | Path) -> None:
    """Give every folder and file under ``root`` (and ``root``) the mode a plain ``mkdir`` or
    ``open()`` would under the current umask: writers that go through temporary files (e.g.
    safetensors' model files, mkdtemp's folders) leave them 0600/0700."""
    mask = _umask()
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        executable = path.is_dir() or bool(path.stat().st_mode & 0o100)
        os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def staging_dir(parent: str | Path, prefix: str) -> Path:
    """A new temporary folder in ``parent`` (same file system, so it can be renamed into
    place), with the mode a plain ``mkdir`` would give it rather than mkdtemp's 0700."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o777 & ~_umask())
    return path


_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def replace_dir(staging: str | Path, final: str | Path) -> None:
    """Put a finished ``staging`` folder in the place of ``final`` (same file system).

    Where the kernel can swap two paths at once, readers of ``final`` see the old folder or the
    new one and never no folder; elsewhere the old one is moved aside first, so for an instant
    ``final`` is absent. The old folder is deleted only after the new one is in place."""
    staging, final = Path(staging), Path(final)
    if final.exists() and _exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the old folder
        return
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    staging.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
