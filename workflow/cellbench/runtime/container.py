"""Run one pipeline step, or one server, in a container through the Docker SDK.

Every stage goes through here, so GPU passthrough, mounts, labels, log streaming, secret
handling and clean-up are done once:

* AMD: ``/dev/kfd`` and ``/dev/dri`` passed as devices, group ``video`` (plus the numeric groups
  of the device nodes, since images may lack a ``render`` group), ``--ipc=host``, a
  shared-memory size and ``seccomp=unconfined`` as the ROCm docs prescribe; never privileged.
  The job's GPUs are chosen with ``HIP_VISIBLE_DEVICES``. ``CELLBENCH_AMD_DEVICES`` (comma-separated
  ``HOST[:CONTAINER]`` device paths) replaces the two device paths, for hosts that keep them
  elsewhere; a machine without a GPU can map a harmless node (``/dev/null:/dev/kfd``) in their
  place to run the whole AMD path, HIP_VISIBLE_DEVICES included, on the CPU.
  ``/dev/dri`` holds every GPU's render node: AMD's isolation is by ``HIP_VISIBLE_DEVICES``,
  not by device cgroup (narrowing to the job's ``renderD*`` nodes is unmeasured on ROCm hosts).
* NVIDIA: a device request for exactly the job's GPU indices (they appear as 0..n-1 inside).
* A job holding no GPU gets no device and no device request, whatever the vendor.
* Every container carries ``cellbench.run`` (``CELLBENCH_RUN_ID``), so a clean-up by run finds
  steps and servers alike; a server that cannot start raises the engine's own message.
* The container's output is streamed to the step's log file as it comes; values of secret
  variables (``HF_TOKEN``...) are replaced by ``***`` in everything written.
* The container is removed however the call ends: success, failure, exception or interrupt.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

# Variables whose values must never reach a log, a result or an archive.
from cellbench.common.secrets import SECRET_ENV

AMD_DEVICES = ("/dev/kfd", "/dev/dri")
AMD_DEVICES_ENV = "CELLBENCH_AMD_DEVICES"
LOG_TAIL_LINES = 50


@dataclass(frozen=True)
class Mount:
    """A bind mount: host ``source`` at ``target`` in the container."""

    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class GpuSpec:
    """Which vendor's passthrough to use and which host GPU indices the job holds."""

    vendor: Literal["amd", "nvidia", "none"]
    indices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.vendor not in ("amd", "nvidia", "none"):
            raise ValueError(f"gpu vendor {self.vendor!r}: expected amd, nvidia or none")
        if self.vendor == "none" and self.indices:
            raise ValueError(f"gpu vendor 'none' with GPU indices {self.indices}")
        if any(i < 0 for i in self.indices) or len(set(self.indices)) != len(self.indices):
            raise ValueError(f"GPU indices {self.indices}: must be distinct and >= 0")


class ContainerFailed(RuntimeError):
    """The containerised command ended badly: non-zero exit, OOM kill, or no start at all."""

    def __init__(self, message: str, *, exit_code: int | None, oom_killed: bool, log_tail: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.oom_killed = oom_killed
        self.log_tail = log_tail


# --- passthrough ---------------------------------------------------------------------------


def _device_groups() -> list[str]:
    """Numeric groups owning the AMD device nodes on this host (e.g. render), if present."""
    gids: list[str] = []
    nodes = [Path("/dev/kfd")]
    dri = Path("/dev/dri")
    if dri.is_dir():
        nodes += sorted(dri.glob("renderD*"))
    for node in nodes:
        try:
            gid = str(node.stat().st_gid)
        except OSError:
            continue
        if gid != "0" and gid not in gids:
            gids.append(gid)
    return gids


def amd_devices(environ: Mapping[str, str] | None = None) -> list[str]:
    """Docker device specs (``host:container:rwm``) for AMD passthrough.

    ``/dev/kfd`` and ``/dev/dri``, unless ``CELLBENCH_AMD_DEVICES`` names others; ValueError
    naming the variable when an entry is malformed.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(AMD_DEVICES_ENV, "").strip()
    if not raw:
        return [f"{d}:{d}:rwm" for d in AMD_DEVICES]
    specs = []
    for item in raw.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (1, 2) or not all(p.startswith("/") for p in parts):
            raise ValueError(
                f"{AMD_DEVICES_ENV}={raw!r}: entry {item!r} is not HOST[:CONTAINER] "
                "with absolute paths"
            )
        host, target = parts[0], parts[-1]
        specs.append(f"{host}:{target}:rwm")
    return specs


def host_config_for(gpus: GpuSpec, shm_size: str = "16g") -> dict[str, Any]:
    """Keyword arguments for ``containers.create`` that give the container its GPUs.

    Pure apart from reading device-node groups, so it can be checked on a machine without GPUs.
    """
    import docker

    kwargs: dict[str, Any] = {"shm_size": shm_size, "privileged": False}
    if not gpus.indices:
        # A job that holds no GPU gets no device node and no device request: without indices
        # AMD's nodes or NVIDIA's count=-1 would hand it every GPU of the host.
        return kwargs
    if gpus.vendor == "amd":
        kwargs["devices"] = amd_devices()
        kwargs["group_add"] = ["video", *_device_groups()]
        kwargs["ipc_mode"] = "host"
        kwargs["security_opt"] = ["seccomp=unconfined"]
    elif gpus.vendor == "nvidia":
        request = docker.types.DeviceRequest(
            device_ids=[str(i) for i in gpus.indices], capabilities=[["gpu"]]
        )
        kwargs["device_requests"] = [request]
        kwargs["ipc_mode"] = "host"
    return kwargs


def gpu_env(gpus: GpuSpec) -> dict[str, str]:
    """Environment that selects the job's GPUs inside the container."""
    if gpus.vendor == "amd" and gpus.indices:
        return {"HIP_VISIBLE_DEVICES": ",".join(map(str, gpus.indices))}
    if gpus.vendor == "nvidia" and gpus.indices:
        # The device request already hides the others; inside they are numbered from 0.
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus.indices)))}
    return {}


# --- logs ----------------------------------------------------------------------------------


class _LogPump:
    """Copies a container's output into a log file in a thread, redacting secret values."""

    def __init__(self, container, log: BinaryIO, secrets: Sequence[str]):
        self._container = container
        self._log = log
        self._secrets = [s.encode() for s in secrets if s]
        self._tail: collections.deque[bytes] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False

    def start(self) -> None:
        self._thread.start()
        self._started = True

    def join(self, timeout: float | None = None) -> None:
        # Clean-up joins on every path, including a container that never started.
        if self._started:
            self._thread.join(timeout)

    def _redact(self, data: bytes) -> bytes:
        for secret in self._secrets:
            data = data.replace(secret, b"***")
        return data

    def _emit(self, line: bytes) -> None:
        line = self._redact(line)
        self._log.write(line)
        self._log.flush()
        with self._lock:
            self._tail.append(line)

    def _run(self) -> None:
        pending = b""
        try:
            for chunk in self._container.logs(stream=True, follow=True):
                pending += chunk
                # Whole lines only, so a secret split across chunks is still redacted.
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._emit(line + b"\n")
        except Exception as exc:  # the container vanished under us: keep what we have
            pending += f"\n[cellbench] log stream ended: {exc}\n".encode()
        if pending:
            self._emit(pending)

    def tail(self, n: int = LOG_TAIL_LINES) -> str:
        with self._lock:
            lines = list(self._tail)[-n:]
        return b"".join(lines).decode(errors="replace")


def _secrets_in(env: Mapping[str, str]) -> list[str]:
    return [v for k, v in env.items() if k in SECRET_ENV and v]


def _describe_env(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}=***" if k in SECRET_ENV else f"{k}={v}" for k, v in sorted(env.items()))


# --- running -------------------------------------------------------------------------------


def _check_inputs(image_ref: str, command: Sequence[str], mounts: Sequence[Mount]) -> None:
    if "@sha256:" not in image_ref:
        raise ValueError(
            f"image_ref {image_ref!r}: a run uses a pinned digest (repo@sha256:...); "
            "pin it with `cellbench images lock`"
        )
    if not command or not all(isinstance(c, str) for c in command):
        raise ValueError(f"command {command!r}: expected a non-empty list of strings")
    for m in mounts:
        if not Path(m.source).exists():
            raise ValueError(f"mount source {m.source!r} (for {m.target}) does not exist")
        if not m.target.startswith("/"):
            raise ValueError(f"mount target {m.target!r} must be an absolute path")


def _create(
    client,
    image_ref: str,
    command: Sequence[str],
    *,
    mounts: Sequence[Mount],
    env: Mapping[str, str],
    gpus: GpuSpec,
    labels: Mapping[str, str],
    shm_size: str,
    workdir: str | None,
    network_mode: str | None,
    log: BinaryIO,
    mem_limit: str | None = None,
):
    from cellbench.runtime import images

    # Progress on stderr (the job's console), not in the step's log.
    images.ensure_pulled(client, image_ref, out=sys.stderr)
    full_env = {**gpu_env(gpus), **dict(env)}
    log.write(
        f"[cellbench] image {image_ref}\n[cellbench] command {list(command)}\n"
        f"[cellbench] gpus {gpus.vendor} {list(gpus.indices)}; env {_describe_env(full_env)}\n"
        "".encode()
    )
    log.flush()
    return client.containers.create(
        image_ref,
        command=list(command),
        # The command is whole: an image's own entrypoint (upstream's vllm/vllm-openai has
        # `vllm serve`) would otherwise be put in front of it.
        entrypoint=[],
        environment=full_env,
        volumes={
            m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in mounts
        },
        # Every container (step or server) names the run that made it, so a clean-up by run
        # finds all of them; callers may name a run of their own.
        labels={"cellbench": "1", "cellbench.run": run_id(), **dict(labels)},
        working_dir=workdir,
        network_mode=network_mode,
        mem_limit=mem_limit,
        detach=True,
        **host_config_for(gpus, shm_size),
    )


def run_id() -> str:
    """The run this process belongs to (``CELLBENCH_RUN_ID``, set once per Snakemake run)."""
    return os.environ.get("CELLBENCH_RUN_ID") or "adhoc"


def _start(container, image_ref: str, log: BinaryIO) -> None:
    """Start ``container``; ContainerFailed with the engine's own words when it cannot.

    A command missing from the image fails here, not as an exit status: the engine answers
    'exec: "vllm": executable file not found in $PATH', which is the message a user needs."""
    import docker

    try:
        container.start()
    except docker.errors.APIError as exc:
        why = str(exc.explanation or exc).strip()
        log.write(f"[cellbench] the engine did not start the container: {why}\n".encode())
        log.flush()
        raise ContainerFailed(
            f"container for {image_ref} did not start: {why}",
            exit_code=None,
            oom_killed=False,
            log_tail=why,
        ) from None


def _state(container) -> tuple[str, int | None, bool]:
    container.reload()
    state = container.attrs["State"]
    return state.get("Status", "?"), state.get("ExitCode"), bool(state.get("OOMKilled"))


def _remove(container) -> None:
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise


@contextmanager
def _started(
    image_ref: str,
    command: Sequence[str],
    *,
    mounts: Sequence[Mount],
    env: Mapping[str, str] | None,
    gpus: GpuSpec,
    labels: Mapping[str, str] | None,
    log_path: str | Path,
    shm_size: str,
    workdir: str | None,
    network_mode: str | None,
    mem_limit: str | None,
    client,
    stop_timeout_s: int | None,
) -> Iterator[tuple[Any, _LogPump]]:
    """A container created and started, its output streamed to ``log_path``: yields the
    container and its log pump. On every way out it is stopped first where
    ``stop_timeout_s`` is given (a server), then removed. ValueError on bad arguments,
    before any container exists; ContainerFailed where the engine does not start it."""
    import docker

    env = dict(env or {})
    _check_inputs(image_ref, command, mounts)
    client = client or docker.from_env(timeout=600)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        container = None
        pump: _LogPump | None = None
        try:
            container = _create(
                client,
                image_ref,
                command,
                mounts=mounts,
                env=env,
                gpus=gpus,
                labels=labels or {},
                shm_size=shm_size,
                workdir=workdir,
                network_mode=network_mode,
                log=log,
                mem_limit=mem_limit,
            )
            pump = _LogPump(container, log, _secrets_in(env))
            _start(container, image_ref, log)
            pump.start()
            yield container, pump
        finally:
            if container is not None:
                # Removal comes first in spirit: nothing below may skip it.
                try:
                    if stop_timeout_s is not None:
                        try:
                            container.stop(timeout=stop_timeout_s)
                        except docker.errors.APIError:
                            pass
                        if pump is not None:
                            pump.join(timeout=5)
                finally:
                    _remove(container)


def run_step(
    image_ref: str,
    command: list[str],
    *,
    mounts: Sequence[Mount] = (),
    env: Mapping[str, str] | None = None,
    gpus: GpuSpec = GpuSpec("none"),
    labels: Mapping[str, str] | None = None,
    log_path: str | Path,
    shm_size: str = "16g",
    workdir: str | None = None,
    network_mode: str | None = None,
    mem_limit: str | None = None,
    client=None,
) -> None:
    """Run ``command`` in ``image_ref`` to completion, streaming its output to ``log_path``.

    Blocks until the container exits. Raises ContainerFailed on a non-zero exit or an OOM
    kill (with the exit code and the log's last lines); ValueError on bad arguments, before
    any container exists. The container is removed on every path out, interrupts included.
    ``mem_limit`` (e.g. "64g") caps the container's memory; past it the kernel OOM-kills it.
    """
    import requests

    with _started(
        image_ref,
        command,
        mounts=mounts,
        env=env,
        gpus=gpus,
        labels=labels,
        log_path=log_path,
        shm_size=shm_size,
        workdir=workdir,
        network_mode=network_mode,
        mem_limit=mem_limit,
        client=client,
        stop_timeout_s=None,
    ) as (container, pump):
        while True:
            # Short waits keep the main thread responsive to SIGINT/SIGTERM.
            try:
                container.wait(timeout=2)
                break
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                continue
        pump.join(timeout=30)
        _, exit_code, oom = _state(container)
        if exit_code != 0 or oom:
            why = "killed for lack of memory (OOM)" if oom else f"exited with {exit_code}"
            raise ContainerFailed(
                f"step in {image_ref} {why}; log: {log_path}",
                exit_code=exit_code,
                oom_killed=oom,
                log_tail=pump.tail(),
            )


class RunningContainer:
    """A server container started by ``serve_container``."""

    def __init__(self, container, pump: _LogPump):
        self.container = container
        self._pump = pump

    @property
    def id(self) -> str:
        return self.container.id

    def alive(self) -> bool:
        """True while the container is running."""
        return _state(self.container)[0] in ("created", "running", "restarting")

    def exit_status(self) -> tuple[int | None, bool] | None:
        """None while running; else (exit code, OOM-killed)."""
        status, code, oom = _state(self.container)
        if status in ("created", "running", "restarting"):
            return None
        return code, oom

    def log_tail(self, n: int = 20) -> str:
        return self._pump.tail(n)

    def effective_env(self, names: Sequence[str]) -> dict[str, str]:
        """The named variables as the engine set them in the container: the image's own ENV
        overlaid by what the run passed (images set their own, e.g. VLLM_ROCM_USE_AITER)."""
        self.container.reload()
        pairs = (item.partition("=") for item in self.container.attrs["Config"].get("Env") or [])
        return {k: v for k, _, v in pairs if k in names}


@contextmanager
def serve_container(
    image_ref: str,
    command: list[str],
    *,
    mounts: Sequence[Mount] = (),
    env: Mapping[str, str] | None = None,
    gpus: GpuSpec = GpuSpec("none"),
    labels: Mapping[str, str] | None = None,
    log_path: str | Path,
    network_mode: str | None = "host",
    shm_size: str = "16g",
    stop_timeout_s: int = 20,
    client=None,
) -> Iterator[RunningContainer]:
    """Start a long-running container (a server); stop and remove it when the block exits."""
    with _started(
        image_ref,
        command,
        mounts=mounts,
        env=env,
        gpus=gpus,
        labels=labels,
        log_path=log_path,
        shm_size=shm_size,
        workdir=None,
        network_mode=network_mode,
        mem_limit=None,
        client=client,
        stop_timeout_s=stop_timeout_s,
    ) as (container, pump):
        yield RunningContainer(container, pump)
