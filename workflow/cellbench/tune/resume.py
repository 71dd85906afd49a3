"""Which earlier tuning log a tune may resume: only one written for the same image and problem.

In-container module: standard library only.

``tuning_log.jsonl`` stays between runs so that a killed tune resumes where it stopped. A log
written under another image (the run before a bump), or for another shape, backend, compute
dtype, device, cell variables or package versions, holds timings of other code: read back, it
would let the new run time nothing and label the old image's search with the new image. So
the log's first line names what it was written for (``HEADER_KEY``): the image digest in clear,
everything else as one hash (the cell's variables may hold values that must not be written
out). A log whose first line names something else, or nothing, is not resumed: it is replaced
by a new log before any candidate is timed, and the summary says how many records were set
aside and why. The first line has no ``m`` or ``status``, so ``TuningLog.read`` skips it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cellbench.common import atomicio

HEADER_KEY = "tuning_log_for"


def log_identity(plan: Any, versions: dict[str, str | None]) -> dict[str, str | None]:
    """What a log's timings depend on: the job's image digest, and a hash of the rest."""
    job = plan.job
    problem = {
        "shape": plan.shape.to_dict(),
        "backend": plan.backend,
        "compute_dtype": plan.act_dtype,
        "platform": plan.platform,
        "device_name": plan.device_name,
        "env": dict(sorted((job.env if job else {}).items())),
        "runtime": job.runtime if job else None,
        "vllm_source": plan.vllm_source,
        "versions": versions,
    }
    text = json.dumps(problem, sort_keys=True, separators=(",", ":"))
    return {
        "image_digest": job.image_digest if job else None,
        "problem_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }


def _header(path: Path) -> tuple[dict[str, Any] | None, bool]:
    """(the identity the log's first line names or None, whether the file holds any line)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except FileNotFoundError:
        return None, False
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        return None, bool(first)
    named = rec.get(HEADER_KEY) if isinstance(rec, dict) else None
    return (named if isinstance(named, dict) else None), bool(first)


def _why_not(old: dict[str, Any] | None, new: dict[str, str | None]) -> str:
    if old is None:
        return "its first line names no image (a log from before logs named theirs)"
    if old.get("image_digest") != new["image_digest"]:
        was, now = old.get("image_digest"), new["image_digest"]
        return f"it was written for image {was}, this run's is {now}"
    return (
        "it was written for another shape, backend, compute dtype, device, cell variables or "
        "package versions"
    )


def claim_log(path: str | os.PathLike[str], identity: dict[str, str | None]) -> dict[str, Any]:
    """Make ``path`` this run's log before anything is timed: kept when its first line names
    ``identity``, else replaced by a log holding only that line. Returns what the summary
    records: ``resumed_records``, ``set_aside_records`` and ``set_aside_because``."""
    from cellbench.tune.artifacts import TuningLog

    path = Path(path)
    old, has_lines = _header(path)
    records = len(TuningLog.read(path))
    if old == identity:
        return {"resumed_records": records, "set_aside_records": 0, "set_aside_because": None}
    why = _why_not(old, identity) if has_lines else None
    line = json.dumps({HEADER_KEY: identity}, sort_keys=True, separators=(",", ":")) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomicio.write_text(path, line)
    return {
        "resumed_records": 0,
        "set_aside_records": records,
        "set_aside_because": why if records else None,
    }
