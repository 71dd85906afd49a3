"""The refs a bisect walks: dated nightly tags from the registry, or a file of refs, oldest
first, each resolved to the digest the registry serves for it.

Tags: the registry's tag list (``GET /v2/<repository>/tags/list``, anonymous) filtered by the
image's ``nightly_tag_pattern`` (a regular expression matched against the whole tag). A named
group ``date`` orders the tags (its text, compared as written: use a sortable date such as
``20261201``); without one the tags sort as text. A refs file: one tag or ``repo@sha256:...``
per line, oldest first, ``#`` comments allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import requests

from cellbench.runtime import images


class CandidateError(ValueError):
    """A request for candidates that cannot be met; the message says what and why."""


@dataclass(frozen=True)
class Candidate:
    ref: str  # as given: repository:tag or repository@sha256:...
    digest: str

    @property
    def pinned(self) -> str:
        return images.ImageRef.parse(self.ref).with_digest(self.digest)


def registry_tags(repository: str, timeout: float = 30.0) -> list[str]:
    """Every tag the registry lists for ``repository`` (``host[:port]/path``)."""
    host, _, path = repository.partition("/")
    if not path or ("." not in host and ":" not in host and host != "localhost"):
        raise CandidateError(
            f"{repository}: no registry host in the reference; tags can only be listed from a "
            "named registry (give --refs-file instead)"
        )
    scheme = "http" if host.startswith(("127.0.0.1", "localhost")) else "https"
    url = f"{scheme}://{host}/v2/{path}/tags/list"
    try:
        answer = requests.get(url, timeout=timeout)
        answer.raise_for_status()
        tags = answer.json().get("tags") or []
    except (requests.RequestException, ValueError) as exc:
        raise CandidateError(f"cannot list the tags of {repository} ({url}): {exc}") from None
    return [str(t) for t in tags]


def nightly_tags(tags: list[str], pattern: str) -> list[str]:
    """The tags matching ``pattern`` whole, oldest first."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise CandidateError(
            f"nightly_tag_pattern {pattern!r} is not a regular expression: {exc}"
        ) from None
    matched = [(m, t) for t in tags if (m := regex.fullmatch(t))]
    if not matched:
        shown = ", ".join(sorted(tags)[:8]) or "none"
        raise CandidateError(
            f"nightly_tag_pattern {pattern!r} matches none of the registry's {len(tags)} tags "
            f"(some: {shown})"
        )
    dated = "date" in regex.groupindex
    return [t for _, t in sorted(matched, key=lambda mt: mt[0]["date"] if dated else mt[1])]


def refs_file(path: Path) -> list[str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise CandidateError(
            f"--refs-file {path}: cannot read it ({exc.strerror or exc})"
        ) from None
    refs = [line.split("#", 1)[0].strip() for line in lines]
    refs = [r for r in refs if r]
    if len(refs) < 2:
        raise CandidateError(f"--refs-file {path}: holds {len(refs)} ref(s); a bisect needs 2+")
    for ref in refs:
        images.ImageRef.parse(ref)
    return refs


def expand(repository: str, ref: str) -> str:
    """A bare tag (``nightly-20261201``) as ``repository:tag``; a full reference as it is."""
    return ref if ("/" in ref or "@" in ref) else f"{repository}:{ref}"


def window(refs: list[str], good: str, bad: str) -> list[str]:
    """The refs from ``good`` to ``bad``, both included; refused when either is not among them
    or ``good`` is not older than ``bad``."""
    for name, ref in (("--good", good), ("--bad", bad)):
        if ref not in refs:
            raise CandidateError(
                f"{name} {ref}: not among the {len(refs)} candidate refs ({refs[0]} .. {refs[-1]})"
            )
    i, j = refs.index(good), refs.index(bad)
    if i >= j:
        raise CandidateError(
            f"--good {good} is not older than --bad {bad} (positions {i} and {j} of the "
            "candidates, oldest first): give the older ref as --good"
        )
    return refs[i : j + 1]


def resolve(client, refs: list[str]) -> list[Candidate]:
    """Each ref with the digest the registry serves for it; refused when one is not there."""
    out = []
    for ref in refs:
        try:
            out.append(Candidate(ref, images.resolve_digest(client, ref)))
        except images.ImageError as exc:
            raise CandidateError(f"ref {ref} is not in the registry: {exc}") from None
    return out
