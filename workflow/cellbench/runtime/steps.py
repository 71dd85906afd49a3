"""The one way a Snakemake rule runs a pipeline step: as a host process or in the pinned image.

    python -m cellbench.runtime.steps --runtime local|docker [--image-ref REPO@sha256:...]
        [--gpu-vendor amd|nvidia|none] [--gpus N] [--total-gpus T] [--lease-dir DIR]
        [--mount SRC:DST[:rw]]... [--env K=V]... [--pass-env NAME]... [--label K=V]...
        [--network MODE] [--shm-size SIZE] --log LOG -- COMMAND ARGS...

Both runtimes take a lease (``cellbench.runtime.leases``) when ``--lease-dir`` is given: N GPU
indices
(docker only) and one free TCP port. The command sees the port as ``CELLBENCH_PORT`` in its
environment, and any argument equal to or containing ``@PORT@`` gets the port substituted.

local: COMMAND runs as a host subprocess in its own process group (killed as a group on
interrupt); its output goes to LOG. With ``--gpus N`` (a GPU host running steps natively) the
leased indices are exported as HIP_VISIBLE_DEVICES (amd) or CUDA_VISIBLE_DEVICES (nvidia).

docker: COMMAND runs in the image through ``cellbench.runtime.container.run_step``. Paths work as on
the host: the working directory is mounted read-only at the same absolute path and is the
container's working directory, with its ``results/`` folder mounted read-write over it, so a
rule's relative ``results/...`` paths mean the same file inside and out. The repository's
``workflow/`` is mounted read-only at ``/cellbench/workflow`` and ``PYTHONPATH`` points there.

Exit status: the command's own; 130 after an interrupt; 2 for bad arguments (reported before
any container or lease exists).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import cellbench
from cellbench.common.secrets import SECRET_ENV
from cellbench.runtime import interrupts
from cellbench.runtime.container import ContainerFailed, GpuSpec, Mount, run_step
from cellbench.runtime.leases import LEASE_FILES, gpu_lease, under_slurm

PACKAGE_DIR = Path(cellbench.__file__).resolve().parent
CONTAINER_WORKFLOW = "/cellbench/workflow"
PORT_TOKEN = "@PORT@"


class StepError(ValueError):
    """Bad step arguments; the message names the flag and the value."""


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StepError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def parse_mount(spec: str) -> Mount:
    """``SRC:DST`` (read-only) or ``SRC:DST:rw`` / ``SRC:DST:ro``; SRC is made absolute."""
    parts = spec.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        src, dst, mode = parts
    elif len(parts) == 2:
        (src, dst), mode = parts, "ro"
    else:
        raise StepError(f"--mount {spec!r}: expected SRC:DST or SRC:DST:rw")
    src = os.path.abspath(os.path.expanduser(src))
    if not os.path.exists(src) and mode == "rw":
        # A writable mount is a cache or an output folder: an empty one is a valid start.
        os.makedirs(src, exist_ok=True)
    if not os.path.exists(src):
        raise StepError(f"--mount {spec!r}: source {src!r} does not exist")
    if not dst.startswith("/"):
        raise StepError(f"--mount {spec!r}: target {dst!r} must be absolute")
    return Mount(src, dst, read_only=(mode == "ro"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cellbench.runtime.steps",
        description="Run one pipeline step (local or docker).",
    )
    p.add_argument("--runtime", choices=("local", "docker"), required=True)
    p.add_argument("--image-ref", help="pinned image, repo@sha256:... (docker)")
    p.add_argument("--gpu-vendor", choices=("amd", "nvidia", "none"), default="none")
    p.add_argument("--gpus", type=int, default=0, help="GPUs this step holds")
    p.add_argument("--total-gpus", type=int, default=0, help="GPUs on this host")
    p.add_argument("--lease-dir", help="folder of lease lock files shared by concurrent jobs")
    p.add_argument("--port-base", type=int, default=8100)
    p.add_argument("--mount", action="append", default=[], metavar="SRC:DST[:rw]")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--pass-env", action="append", default=[], metavar="NAME")
    p.add_argument("--label", action="append", default=[], metavar="K=V")
    p.add_argument("--network", default=None, help="container network mode (e.g. host)")
    p.add_argument("--shm-size", default="16g")
    p.add_argument("--log", required=True, help="the rule's log file (appended to)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    return p


def _check(args: argparse.Namespace) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise StepError("no command given after --")
    if args.gpus < 0 or args.total_gpus < 0:
        raise StepError(f"--gpus {args.gpus} / --total-gpus {args.total_gpus}: must be >= 0")
    # Under Slurm the allocation, not the host's configured count, bounds the GPUs.
    if args.gpus > args.total_gpus and not under_slurm():
        raise StepError(f"--gpus {args.gpus} exceeds --total-gpus {args.total_gpus}")
    if args.runtime == "docker" and (not args.image_ref or "@sha256:" not in args.image_ref):
        raise StepError(
            f"--image-ref {args.image_ref!r}: docker steps run a pinned digest "
            "(repo@sha256:...); run `cellbench images lock`"
        )
    if args.gpus and args.gpu_vendor == "none":
        raise StepError(f"--gpus {args.gpus} with --gpu-vendor none")
    if args.gpus and not args.lease_dir:
        raise StepError("--gpus needs --lease-dir so concurrent jobs get disjoint GPUs")
    return command


def workflow_mount() -> Mount:
    """The repository's workflow/ (or, for an installed copy, the package alone), read-only."""
    if PACKAGE_DIR.parent.name == "workflow":
        return Mount(str(PACKAGE_DIR.parent), CONTAINER_WORKFLOW, read_only=True)
    return Mount(str(PACKAGE_DIR), f"{CONTAINER_WORKFLOW}/cellbench", read_only=True)


def host_gpu_env(vendor: str, indices: Sequence[int]) -> dict[str, str]:
    """Variables that restrict a host process to the leased GPUs."""
    if not indices:
        return {}
    value = ",".join(map(str, indices))
    if vendor == "amd":
        return {"HIP_VISIBLE_DEVICES": value}
    if vendor == "nvidia":
        return {"CUDA_VISIBLE_DEVICES": value}
    return {}


def _with_port(command: list[str], port: int | None) -> list[str]:
    if port is None:
        return command
    return [c.replace(PORT_TOKEN, str(port)) for c in command]


def run_local(command: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run ``command`` on the host, its output (secrets redacted) appended to ``log_path``."""
    secrets = [v.encode() for k, v in env.items() if k in SECRET_ENV and v]
    with open(log_path, "ab") as log:
        log.write(f"[cellbench] local: {shlex.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own group, so an interrupt reaches all its children
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                for s in secrets:
                    line = line.replace(s, b"***")
                log.write(line)
                log.flush()
            return proc.wait()
        finally:
            if proc.poll() is None:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_docker(args: argparse.Namespace, command: list[str], env: dict[str, str], lease) -> int:
    cwd = Path.cwd().resolve()
    results = cwd / "results"
    results.mkdir(exist_ok=True)
    mounts = [
        Mount(str(cwd), str(cwd), read_only=True),
        Mount(str(results), str(results), read_only=False),
        workflow_mount(),
        *(parse_mount(m) for m in args.mount),
    ]
    env = {**env, "PYTHONPATH": CONTAINER_WORKFLOW}
    labels = {
        "cellbench.run": os.environ.get("CELLBENCH_RUN_ID", "adhoc"),
        "cellbench.workdir": str(cwd),
        "cellbench.log": str(Path(args.log).resolve()),
        **_pairs(args.label, "--label"),
    }
    gpus = GpuSpec(args.gpu_vendor, lease.gpu_indices if lease else ())
    try:
        run_step(
            args.image_ref,
            command,
            mounts=mounts,
            env=env,
            gpus=gpus,
            labels=labels,
            log_path=args.log,
            shm_size=args.shm_size,
            workdir=str(cwd),
            network_mode=args.network,
        )
    except ContainerFailed as exc:
        print(f"cellbench step: {exc}", file=sys.stderr)
        if exc.log_tail:
            print(exc.log_tail.rstrip(), file=sys.stderr)
        if exc.oom_killed:
            return 137
        return exc.exit_code if exc.exit_code else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        command = _check(args)
        extra_env = _pairs(args.env, "--env")
        for m in args.mount:
            parse_mount(m)
    except StepError as exc:
        print(f"cellbench step: error: {exc}", file=sys.stderr)
        return 2
    log_path = Path(args.log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # SIGTERM (Snakemake cancelling a job, a scheduler) unwinds like Ctrl-C: leases released,
    # the container or process group removed.
    # SIGINT too, and a repeat (a Ctrl-C to the group, then Snakemake's forwarded SIGTERM)
    # is ignored so that it cannot cut this clean-up short (cellbench.runtime.interrupts).
    interrupts.install_in_stage()
    try:
        with ExitStack() as stack:
            lease = None
            if args.lease_dir:
                lease = stack.enter_context(
                    gpu_lease(
                        args.gpus,
                        args.total_gpus,
                        args.lease_dir,
                        port_base=args.port_base,
                        vendor=args.gpu_vendor,
                        for_container=args.runtime == "docker",
                    )
                )
                if args.gpus:
                    with open(log_path, "a") as log:
                        log.write(
                            f"[cellbench] GPUs {list(lease.gpu_indices)} "
                            f"decided by {lease.gpu_source}\n"
                        )
            port = lease.port if lease else None
            command = _with_port(command, port)
            if args.runtime == "local":
                env = {**os.environ, **extra_env}
                # Under Slurm the job's own visible-devices variables already name its GPUs
                # (possibly renumbered inside its cgroup); indices laid over them would not.
                if lease is not None and lease.gpu_source == LEASE_FILES:
                    env.update(host_gpu_env(args.gpu_vendor, lease.gpu_indices))
                    env["CELLBENCH_PORT"] = str(lease.port)
                return run_local(command, env, log_path)
            env = {k: os.environ[k] for k in args.pass_env if os.environ.get(k)}
            env.update(extra_env)
            if port is not None:
                env["CELLBENCH_PORT"] = str(port)
            return run_docker(args, command, env, lease)
    except KeyboardInterrupt:
        print("cellbench step: interrupted; step stopped and cleaned up", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
