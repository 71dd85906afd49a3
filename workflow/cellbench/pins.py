"""The digest each configured image is pinned to, as the workflow's rules see it.

The lock file is written by `cellbench images` (cellbench.images); this module only reads it.
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
            from cellbench import images

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
