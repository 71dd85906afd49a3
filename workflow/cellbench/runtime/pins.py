"""The digest each configured image is pinned to, as the workflow's rules see it.

The lock file is written by `cellbench images` (cellbench.runtime.images); this module only reads
it.
A pin enters every job of its cells as a rule parameter, so moving one image's pin reruns
exactly that image's cells. The local runtime has no image: its "pin" names the host
environment instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNPINNED = "unpinned"


@dataclass(frozen=True)
class Pins:
    runtime: str
    refs: dict[str, str]  # image name -> "repo@sha256:..." (or "" when not pinned)
    lock_path: str

    @classmethod
    def for_config(cls, config: dict[str, Any]) -> Pins:
        if config["runtime"] != "docker":
            return cls("local", {}, "")
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
            return "local:python" + ".".join(map(str, sys.version_info[:3]))
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
