"""GPU and port leases for concurrent jobs on one host.

Snakemake's ``resources: gpu=N`` only counts GPUs; it never says which ones. A job therefore
takes a lease: an exclusive file lock (``filelock``, i.e. ``flock``) per GPU index and one per
port, under a shared lease folder. Locks die with their process, so a lease is released however
the job ends, a kill -9 included. A job that finds too few free GPUs releases what it took
(no partial holds, so no deadlock between jobs) and waits, saying so on stderr.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from filelock import FileLock, Timeout

DEFAULT_TIMEOUT_S = 24 * 3600.0
PORT_SPAN = 200  # ports tried above port_base


@dataclass(frozen=True)
class Lease:
    """GPUs and a TCP port held exclusively by one job until its context exits."""

    gpu_indices: tuple[int, ...]
    port: int


def _try_lock(path: Path, stack: ExitStack) -> bool:
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return False
    stack.callback(lock.release)
    return True


def _write_owner(path: Path) -> None:
    # Who holds it, for the waiting message; advisory only (the lock is the truth).
    try:
        path.write_text(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
    except OSError:
        pass


def _owners(lease_dir: Path, total: int) -> str:
    held = []
    for i in range(total):
        owner = lease_dir / f"gpu{i}.owner"
        if owner.exists():
            try:
                held.append(f"gpu{i} ({owner.read_text().strip()})")
            except OSError:
                continue
    return "; ".join(held) or "unknown holders"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _take_gpus(count: int, total: int, lease_dir: Path, stack: ExitStack) -> tuple[int, ...]:
    """Lock ``count`` free GPU indices into ``stack``, or none at all (returns ())."""
    taken: list[int] = []
    attempt = ExitStack()
    for i in range(total):
        if len(taken) == count:
            break
        if _try_lock(lease_dir / f"gpu{i}.lock", attempt):
            taken.append(i)
    if len(taken) < count:
        attempt.close()
        return ()
    stack.enter_context(attempt)
    for i in taken:
        owner = lease_dir / f"gpu{i}.owner"
        _write_owner(owner)
        # Runs before the lock's release (LIFO), so a stale owner is never shown.
        stack.callback(owner.unlink, missing_ok=True)
    return tuple(taken)


def _take_port(port_base: int, lease_dir: Path, stack: ExitStack) -> int | None:
    for port in range(port_base, port_base + PORT_SPAN):
        attempt = ExitStack()
        if _try_lock(lease_dir / f"port{port}.lock", attempt):
            if _port_free(port):
                stack.enter_context(attempt)
                return port
        attempt.close()
    return None


@contextmanager
def gpu_lease(
    count: int,
    total: int,
    lease_dir: str | Path,
    *,
    port_base: int = 8100,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = 1.0,
    out: TextIO | None = sys.stderr,
) -> Iterator[Lease]:
    """Hold ``count`` of the host's ``total`` GPUs and one free port while the block runs.

    Waits while not enough GPUs are free, printing once who holds them; raises TimeoutError
    after ``timeout_s``. ``count`` may be 0 (a port only). Raises ValueError on impossible
    requests before waiting.
    """
    if count < 0 or total < 0:
        raise ValueError(f"gpu lease: count={count}, total={total}: must be >= 0")
    if count > total:
        raise ValueError(f"gpu lease: {count} GPUs asked for but the host has gpus={total}")
    if not 0 < port_base < 65536 - PORT_SPAN:
        raise ValueError(f"gpu lease: port_base={port_base} out of range")
    lease_dir = Path(lease_dir)
    lease_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    told = False
    with ExitStack() as stack:
        while True:
            gpus = _take_gpus(count, total, lease_dir, stack) if count else ()
            if len(gpus) == count:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"gpu lease: {count} of {total} GPUs not free after {timeout_s:.0f} s "
                    f"(held: {_owners(lease_dir, total)})"
                )
            if not told and out is not None:
                print(
                    f"[cellbench] waiting for {count} of {total} GPUs in {lease_dir} "
                    f"(held: {_owners(lease_dir, total)})",
                    file=out,
                    flush=True,
                )
                told = True
            time.sleep(poll_s)
        port = _take_port(port_base, lease_dir, stack)
        if port is None:
            raise RuntimeError(
                f"gpu lease: no free port in {port_base}..{port_base + PORT_SPAN - 1}"
            )
        if told and out is not None:
            print(f"[cellbench] got GPUs {list(gpus)}, port {port}", file=out, flush=True)
        yield Lease(gpus, port)
