"""Pin configured images by digest, pull them, and say when a tag has moved.

The config names each image by tag (``registry/repo:tag``); the lock file
(``config/images.lock.yaml`` by default) records, per image name, the digest the tag resolved
to, the ROCm version read from the image, and when it was resolved. Jobs run the pinned digest
only: a tag that moves later is reported by ``cellbench images status`` and followed only by
an explicit ``cellbench images bump NAME``.

Command line (``cellbench images ...``, in ``cellbench.config.images_command``)::

    cellbench images lock   [--configfile F] [--lock F]   # pin images that have no pin yet
    cellbench images bump NAME [--configfile F] [--lock F] # move NAME's pin to the tag's digest
    cellbench images status [--configfile F] [--lock F]   # per image: current | moved | unpinned
"""

from __future__ import annotations

import io
import sys
import tarfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from cellbench.common import atomicio

LOCK_VERSION = 1
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
# Labels and environment variables some images use for their ROCm version, in the order tried
# after the version file.
ROCM_LABELS = ("org.cellbench.rocm-version", "com.amd.rocm.version", "rocm_version", "rocm.version")
ROCM_ENV = ("ROCM_VERSION",)


class ImageError(RuntimeError):
    """Resolving, pulling or checking an image failed; the message says which and why."""


class RegistryUnreachable(ImageError):
    """The registry (or the network to it) did not answer: nothing is known about the tag."""


# `cellbench images` exit statuses: each answer its own, so a script can tell them apart.
EXIT_OK = 0
EXIT_ERROR = 2  # bad input, an engine error, a refused pin
EXIT_MOVED = 3  # a tag is not as pinned (moved, unpinned, or its ref changed)
EXIT_UNREACHABLE = 4  # the registry could not be asked


# --- references ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    """A parsed ``repository[:tag][@digest]`` reference."""

    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        if not ref or any(c.isspace() for c in ref):
            raise ImageError(f"image reference {ref!r} is empty or contains whitespace")
        rest, _, digest = ref.partition("@")
        digest = digest or None
        tag = None
        colon = rest.rfind(":")
        # A colon after the last slash separates the tag; one before it is a registry port.
        if colon > rest.rfind("/"):
            rest, tag = rest[:colon], rest[colon + 1 :]
        if digest is not None and not digest.startswith("sha256:"):
            raise ImageError(f"image reference {ref!r}: digest must start with 'sha256:'")
        if not rest:
            raise ImageError(f"image reference {ref!r} has no repository")
        return cls(rest, tag, digest)

    def with_digest(self, digest: str) -> str:
        return f"{self.repository}@{digest}"

    def __str__(self) -> str:
        out = self.repository
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


# --- lock file -----------------------------------------------------------------------------


def load_lock(path: str | Path) -> dict[str, Any]:
    """Read a lock file; a missing file is an empty lock. Raises ImageError if malformed."""
    path = Path(path)
    if not path.exists():
        return {"version": LOCK_VERSION, "images": {}}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ImageError(f"lock file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images", {}), dict):
        raise ImageError(f"lock file {str(path)!r}: expected a mapping with an 'images' mapping")
    data.setdefault("images", {})
    for name, entry in data["images"].items():
        for key in ("ref", "digest"):
            if not isinstance(entry, dict) or not isinstance(entry.get(key), str):
                raise ImageError(f"lock file {str(path)!r}: images.{name}.{key} is missing")
        if not entry["digest"].startswith("sha256:"):
            raise ImageError(
                f"lock file {str(path)!r}: images.{name}.digest = {entry['digest']!r} "
                "is not a sha256 digest"
            )
    return data


def save_lock(path: str | Path, lock: dict[str, Any]) -> None:
    """Write the lock file atomically, images sorted by name."""
    lock = {"version": LOCK_VERSION, "images": dict(sorted(lock.get("images", {}).items()))}
    header = (
        "# Written by `cellbench images lock|bump`: the digest each configured image runs.\n"
        "# Edit the config's tags, not this file; a moved tag is followed only by `bump`.\n"
    )
    atomicio.write_text(path, header + yaml.safe_dump(lock, sort_keys=False))


def pinned_digest(lock: dict[str, Any], name: str) -> str:
    """The pinned ``sha256:...`` digest of image ``name``; KeyError if it has no pin."""
    try:
        return lock["images"][name]["digest"]
    except KeyError:
        raise KeyError(f"image {name!r} has no pin; run `cellbench images lock`") from None


def pinned_ref(lock: dict[str, Any], name: str) -> str:
    """``repository@sha256:...`` for image ``name``: what a container is started from."""
    digest = pinned_digest(lock, name)
    return ImageRef.parse(lock["images"][name]["ref"]).with_digest(digest)


# --- the engine and the registry -----------------------------------------------------------


def docker_client(timeout: int = 600):
    """A docker SDK client from the environment; ImageError if no engine answers."""
    import docker

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # the SDK raises several types for "no engine"
        raise ImageError(
            f"cannot reach the Docker engine (DOCKER_HOST or the socket): {exc}"
        ) from None
    return client


def classify_pull_error(ref: str, message: str) -> ImageError:
    """Turn an engine or registry error text into one of the errors users can act on."""
    text = message.lower()
    if "no space left" in text:
        why = "no space left on the Docker data disk (docker system df; prune or grow it)"
    elif any(k in text for k in ("unauthorized", "authentication required", "denied", "401")):
        why = "unauthorised: log in with `docker login` or check the repository's access"
    elif any(k in text for k in ("not found", "manifest unknown", "no such image", "404")):
        why = "not found in the registry (check the repository, tag or digest)"
    elif any(
        k in text
        for k in (
            "connection refused",
            "no such host",
            "i/o timeout",
            "dial tcp",
            "timeout",
            "network is unreachable",
            "server misbehaving",
            "tls handshake",
        )
    ):
        why = "registry unreachable (network, DNS or the registry is down)"
        return RegistryUnreachable(f"image {ref}: {why}: {message.strip()}")
    else:
        why = "failed"
    return ImageError(f"image {ref}: {why}: {message.strip()}")


def resolve_digest(client, ref: str) -> str:
    """The digest the registry serves for ``ref`` now, without pulling."""
    import docker

    try:
        return client.images.get_registry_data(ref).id
    except docker.errors.APIError as exc:
        raise classify_pull_error(ref, str(exc.explanation or exc)) from None
    except Exception as exc:
        raise classify_pull_error(ref, str(exc)) from None


def pull(client, ref: str, *, out: TextIO | None = sys.stderr, every_s: float = 2.0):
    """Pull ``ref`` (normally ``repo@sha256:...``) showing progress; return the Image.

    Progress is one line per layer state change and a byte total at most every ``every_s``
    seconds, so a log stays readable for multi-GB images.
    """
    import docker

    parsed = ImageRef.parse(ref)
    tag = parsed.digest or parsed.tag or "latest"
    layers: dict[str, tuple[int, int]] = {}
    last = 0.0
    try:
        for event in client.api.pull(parsed.repository, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise classify_pull_error(ref, event.get("error") or str(event))
            status, layer = event.get("status", ""), event.get("id", "")
            detail = event.get("progressDetail") or {}
            if detail.get("total"):
                layers[layer] = (detail.get("current", 0), detail["total"])
            if out is None:
                continue
            now = time.monotonic()
            if status in ("Downloading", "Extracting") and now - last < every_s:
                continue
            last = now
            if layers:
                done = sum(c for c, _ in layers.values()) / 1e6
                total = sum(t for _, t in layers.values()) / 1e6
                print(f"pull {ref}: {status} {layer} ({done:.0f}/{total:.0f} MB)", file=out)
            else:
                print(f"pull {ref}: {status} {layer}".rstrip(), file=out)
    except ImageError:
        raise
    except docker.errors.APIError as exc:
        raise classify_pull_error(ref, str(exc.explanation or exc)) from None
    except Exception as exc:
        raise classify_pull_error(ref, str(exc)) from None
    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise ImageError(f"image {ref}: pulled, yet the engine has no such image") from None


def ensure_pulled(client, ref: str, *, out: TextIO | None = sys.stderr):
    """The local image for ``ref``, pulling it only when the engine lacks it."""
    import docker

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return pull(client, ref, out=out)


def read_rocm_version(client, ref: str) -> str | None:
    """ROCm version held by a local image: the version file, else a label, else ENV; or None.

    The file is read from a created (never started) container, so this works without GPUs.
    """
    import docker

    image = client.images.get(ref)
    container = client.containers.create(image.id, command=["true"], entrypoint=[])
    try:
        stream, _ = container.get_archive(ROCM_VERSION_FILE)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member else None
            if handle is not None:
                text = handle.read().decode(errors="replace").strip()
                if text:
                    return text
    except docker.errors.NotFound:
        pass
    finally:
        container.remove(force=True)
    labels = image.labels or {}
    for key in ROCM_LABELS:
        if labels.get(key):
            return labels[key].strip()
    env = dict(e.split("=", 1) for e in (image.attrs["Config"].get("Env") or []) if "=" in e)
    for key in ROCM_ENV:
        if env.get(key):
            return env[key].strip()
    return None


def rocm_matches(declared: str, found: str) -> bool:
    """True when the image's version (e.g. ``7.0.2-56``) is the declared one (``7.0``)."""
    found = found.strip()
    return found == declared or found.startswith((declared + ".", declared + "-"))


def check_rocm(name: str, declared: str | None, found: str | None) -> None:
    if declared is None:
        return
    if found is None:
        raise ImageError(
            f"image {name!r}: config declares rocm_version {declared!r} but the image has no "
            f"{ROCM_VERSION_FILE}, ROCm label or ROCM_VERSION variable"
        )
    if not rocm_matches(declared, found):
        raise ImageError(
            f"image {name!r}: config declares rocm_version {declared!r} but the image holds "
            f"ROCm {found!r}; fix images.{name}.rocm_version or the tag"
        )


def pin(client, name: str, spec: dict[str, Any], *, out: TextIO | None = sys.stderr) -> dict:
    """Resolve ``spec['ref']`` to a digest, pull it, check its ROCm version; a lock entry."""
    ref = spec["ref"]
    parsed = ImageRef.parse(ref)
    if parsed.digest:
        raise ImageError(f"images.{name}.ref = {ref!r}: give a tag; digests live in the lock")
    digest = resolve_digest(client, ref)
    pinned = parsed.with_digest(digest)
    ensure_pulled(client, pinned, out=out)
    found = read_rocm_version(client, pinned)
    check_rocm(name, spec.get("rocm_version"), found)
    entry = {"ref": ref, "digest": digest, "rocm_version": found}
    entry["resolved_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return entry


# --- commands ------------------------------------------------------------------------------


def cmd_lock(cfg: dict[str, Any], lock_path: Path, client, out: TextIO) -> int:
    lock = load_lock(lock_path)
    changed = False
    for name, spec in cfg["images"].items():
        entry = lock["images"].get(name)
        if entry and entry["ref"] == spec["ref"]:
            # The registry is asked even so: a lock that answered "nothing to pin" with the
            # registry down would say all is well about tags it never saw.
            now = resolve_digest(client, spec["ref"])
            moved = "" if now == entry["digest"] else f"; the tag now serves {now} (bump to move)"
            print(f"{name}: pinned {entry['digest']} ({entry['ref']}){moved}", file=out)
            continue
        if entry:
            raise ImageError(
                f"images.{name}.ref = {spec['ref']!r} but the lock pins {entry['ref']!r}: "
                f"run `cellbench images bump {name}` to move the pin deliberately"
            )
        lock["images"][name] = pin(client, name, spec)
        changed = True
        print(f"{name}: pinned {lock['images'][name]['digest']} ({spec['ref']})", file=out)
        # Save after each image so an error on a later one keeps the pins already made.
        save_lock(lock_path, lock)
    if not changed:
        print(f"{lock_path}: nothing to pin", file=out)
    return 0


def cmd_bump(cfg: dict[str, Any], lock_path: Path, name: str, client, out: TextIO) -> int:
    if name not in cfg["images"]:
        known = ", ".join(sorted(cfg["images"]))
        raise ImageError(f"image {name!r} is not defined under images (known: {known})")
    lock = load_lock(lock_path)
    old = lock["images"].get(name)
    new = pin(client, name, cfg["images"][name])
    old_digest = old["digest"] if old else "(unpinned)"
    if old and old["digest"] == new["digest"] and old["ref"] == new["ref"]:
        print(f"{name}: unchanged {old_digest} ({new['ref']})", file=out)
        return 0
    lock["images"][name] = new
    save_lock(lock_path, lock)
    print(f"{name}: {old_digest} -> {new['digest']} ({new['ref']})", file=out)
    return 0


def image_status(cfg: dict[str, Any], lock: dict[str, Any], client) -> list[dict[str, str]]:
    """Per configured image: name, ref, pinned, current, state (current|moved|unpinned|...)."""
    rows = []
    for name, spec in cfg["images"].items():
        entry = lock["images"].get(name)
        row = {"name": name, "ref": spec["ref"], "pinned": entry["digest"] if entry else "-"}
        try:
            row["current"] = resolve_digest(client, spec["ref"])
        except ImageError as exc:
            state = "unreachable" if isinstance(exc, RegistryUnreachable) else "unresolvable"
            row["current"], row["state"], row["detail"] = "-", state, str(exc)
            rows.append(row)
            continue
        if not entry:
            row["state"] = "unpinned"
        elif entry["ref"] != spec["ref"]:
            row["state"] = "ref-changed"
        elif entry["digest"] != row["current"]:
            row["state"] = "moved"
        else:
            row["state"] = "current"
        rows.append(row)
    return rows


def cmd_status(cfg: dict[str, Any], lock_path: Path, client, out: TextIO) -> int:
    rows = image_status(cfg, load_lock(lock_path), client)
    for row in rows:
        line = f"{row['name']}\t{row['state']}\t{row['ref']}\tpinned={row['pinned']}"
        line += f"\ttag-now={row['current']}"
        print(line, file=out)
        if row.get("detail"):
            print(f"  {row['detail']}", file=out)
        elif row["state"] == "moved":
            hint = f"cellbench images bump {row['name']}"
            print(f"  the tag moved; runs keep the pin until `{hint}`", file=out)
    # Non-zero when anything is not as pinned, so scripts and CI can react: unreachable first
    # (nothing is known about those tags), then not as pinned, then an unresolvable tag.
    states = {r["state"] for r in rows}
    if "unreachable" in states:
        return EXIT_UNREACHABLE
    if states & {"moved", "unpinned", "ref-changed"}:
        return EXIT_MOVED
    return EXIT_OK if states <= {"current"} else EXIT_ERROR
