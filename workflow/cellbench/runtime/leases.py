"""GPU and port leases for concurrent jobs on one host.

Snakemake's ``resources: gpu=N`` only counts GPUs; it never says which ones. A job therefore
takes a lease: an exclusive file lock (``filelock``, i.e. ``flock``) per GPU index and one per
port, under a shared lease folder. Locks die with their process, so a lease is released however
the job ends, a kill -9 included. A job that finds too few free GPUs releases what it took
(no partial holds, so no deadlock between jobs) and waits, saying so on stderr.

Ports belong to the host, not to a results folder: their locks live in one folder per user
on the host (``/tmp/cellbench-ports-UID``), so two checkouts (or two test runs) serving on one
machine never hand out the same port. With per-folder port locks a run's readiness probe once
reached another checkout's server on the port its own server had not yet bound.

Under Slurm (``SLURM_JOB_ID`` set) the lease files would only coordinate the jobs of one node
through a shared folder and could not see the other nodes' jobs, so they take no part in the
choice of GPUs: Slurm's allocation decides, read from the job's environment
(``allocated_gpus``), and the lease says which variable it came from. Ports are per node, so
their locks move to a node-local folder.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from filelock import FileLock, Timeout

DEFAULT_TIMEOUT_S = 24 * 3600.0
PORT_SPAN = 200  # ports tried above port_base
LEASE_FILES = "lease files"  # gpu_source of a lease decided by this module's own locks
# Port locks: on the host itself (/tmp, not a per-job TMPDIR or a results folder), since every
# job and checkout of one host shares its ports and jobs of different nodes never do.
NODE_PORT_LOCKS = Path("/tmp")
# Where Slurm names a job's GPUs. The visible-devices variables are what a process on the node
# sees (with ConstrainDevices they are renumbered from 0 inside the job's cgroup); the
# SLURM_*_GPUS ones are the node's own indices, which a container started by the node's Docker
# daemon, outside that cgroup, must be given.
VISIBLE_VARS = {"amd": "ROCR_VISIBLE_DEVICES", "nvidia": "CUDA_VISIBLE_DEVICES"}
SLURM_GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


@dataclass(frozen=True)
class Lease:
    """GPUs and a TCP port held exclusively by one job until its context exits.
    ``gpu_source``: what decided the GPUs (the lease files, or the Slurm variable read)."""

    gpu_indices: tuple[int, ...]
    port: int
    gpu_source: str = LEASE_FILES


def under_slurm(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a Slurm job."""
    return bool((os.environ if env is None else env).get("SLURM_JOB_ID"))


def _job_offset(env: Mapping[str, str] | None) -> int:
    job_id = (os.environ if env is None else env).get("SLURM_JOB_ID", "")
    # Consecutive job ids land 7 ports apart (7 and PORT_SPAN share no factor).
    return (int(job_id) * 7) % PORT_SPAN if job_id.isdigit() else 0


def _source_order(vendor: str | None, for_container: bool) -> list[str]:
    first = VISIBLE_VARS.get(vendor or "")
    visible = [first] if first else []
    visible += [v for v in VISIBLE_VARS.values() if v not in visible]
    return [*SLURM_GPU_VARS, *visible] if for_container else [*visible, *SLURM_GPU_VARS]


def _indices(name: str, value: str) -> tuple[int, ...]:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise ValueError(
            f"gpu lease: {name}={value!r} from the Slurm allocation is not a list of GPU "
            "indices (e.g. 0,1); configure the node's gres.conf so Slurm exports indices"
        )
    return tuple(int(p) for p in parts)


def allocated_gpus(
    count: int,
    env: Mapping[str, str] | None = None,
    *,
    vendor: str | None = None,
    for_container: bool = False,
) -> tuple[tuple[int, ...], str]:
    """The GPUs Slurm gave this job, and the variable that named them.

    Sources in order: the vendor's visible-devices variable, the other vendor's, then
    SLURM_STEP_GPUS and SLURM_JOB_GPUS; ``for_container`` puts the SLURM_*_GPUS (node indices)
    first. Slurm's ``NoDevFiles`` and empty values are skipped. Raises ValueError when the
    allocation names fewer GPUs than ``count`` (the job was submitted without enough
    ``gpu``/``gres``); a larger allocation gives its first ``count``.
    """
    env = os.environ if env is None else env
    if count == 0:
        return (), "Slurm allocation (no GPUs asked)"
    for name in _source_order(vendor, for_container):
        value = env.get(name, "").strip()
        if not value or value == "NoDevFiles":
            continue
        indices = _indices(name, value)
        if len(indices) < count:
            raise ValueError(
                f"gpu lease: the Slurm allocation names {len(indices)} GPU(s) ({name}={value}) "
                f"but the job needs {count}; submit it with gpu={count} (or gres=gpu:{count})"
            )
        if len(indices) > count:
            return indices[:count], f"{name} (first {count} of {len(indices)})"
        return indices, name
    raise ValueError(
        f"gpu lease: job {env.get('SLURM_JOB_ID')} runs under Slurm but its allocation names no "
        f"GPUs (none of {', '.join(_source_order(vendor, for_container))} is set); the job needs "
        f"{count}: submit it with gpu={count} (or gres=gpu:{count})"
    )


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


def _take_port(port_base: int, lease_dir: Path, stack: ExitStack, start: int = 0) -> int | None:
    """Lock the first free port of port_base..port_base+PORT_SPAN-1, searching from
    ``start`` places in and wrapping around."""
    for i in range(PORT_SPAN):
        port = port_base + (start + i) % PORT_SPAN
        attempt = ExitStack()
        if _try_lock(lease_dir / f"port{port}.lock", attempt):
            if _port_free(port):
                stack.enter_context(attempt)
                return port
        attempt.close()
    return None


def host_port_dir() -> Path:
    """The folder of this user's port locks on this host (made if missing)."""
    node_dir = NODE_PORT_LOCKS / f"cellbench-ports-{os.getuid()}"
    node_dir.mkdir(parents=True, exist_ok=True)
    return node_dir


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
    vendor: str | None = None,
    for_container: bool = False,
    env: Mapping[str, str] | None = None,
) -> Iterator[Lease]:
    """Hold ``count`` of the host's ``total`` GPUs and one free port while the block runs.

    Waits while not enough GPUs are free, printing once who holds them; raises TimeoutError
    after ``timeout_s``. ``count`` may be 0 (a port only). Raises ValueError on impossible
    requests before waiting.

    Under Slurm (``env``, default os.environ, has SLURM_JOB_ID) the allocation gives the GPUs
    (``allocated_gpus`` with ``vendor`` and ``for_container``), ``total`` is not consulted and
    the port is locked in the node's folder as always.
    """
    if count < 0 or total < 0:
        raise ValueError(f"gpu lease: count={count}, total={total}: must be >= 0")
    if not 0 < port_base < 65536 - PORT_SPAN:
        raise ValueError(f"gpu lease: port_base={port_base} out of range")
    if under_slurm(env):
        gpus, source = allocated_gpus(count, env, vendor=vendor, for_container=for_container)
        node_dir = host_port_dir()
        with ExitStack() as stack:
            # Other users' jobs on the node lock ports elsewhere; starting each job's search
            # at its own place in the span makes two jobs rarely race for one free port.
            port = _take_port(port_base, node_dir, stack, start=_job_offset(env))
            if port is None:
                raise RuntimeError(
                    f"gpu lease: no free port in {port_base}..{port_base + PORT_SPAN - 1} "
                    f"on this node ({node_dir})"
                )
            yield Lease(gpus, port, source)
        return
    if count > total:
        raise ValueError(f"gpu lease: {count} GPUs asked for but the host has gpus={total}")
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
        port = _take_port(port_base, host_port_dir(), stack)
        if port is None:
            raise RuntimeError(
                f"gpu lease: no free port in {port_base}..{port_base + PORT_SPAN - 1} "
                f"on this host ({host_port_dir()})"
            )
        if told and out is not None:
            print(f"[cellbench] got GPUs {list(gpus)}, port {port}", file=out, flush=True)
        yield Lease(gpus, port)
