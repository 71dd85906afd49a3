"""Byte-stable JSON for jobs: the rules track a job's canonical text as a param, so it must
change exactly when a value does. Stdlib only: the tuner's side (and its tests, on a machine
with only the image's packages) write and read the same text."""

from __future__ import annotations

import json
from typing import Any


def canonical(job: dict[str, Any]) -> str:
    """A job as byte-stable JSON (sorted keys, no spaces)."""
    return json.dumps(job, sort_keys=True, separators=(",", ":"))
