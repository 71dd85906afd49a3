"""Earlier runs' noise for this run's verdicts: the start-to-start and within-start variance
components of the archive's runs of the same cell (model, layout) and image digest, per grid
point and metric (``cellbench.stats.starts.prior_from_benches``), pooled into the report's
untuned-vs-tuned comparison. A run archived from these very results is left out, so the
data are never counted twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from cellbench.common.atomicio import sha256_file
from cellbench.results import archived
from cellbench.stats import comparison, starts


def _digest(bench: Path) -> str | None:
    try:
        return json.loads(bench.read_text()).get("image_digest")
    except (OSError, ValueError):
        return None


def archive_priors(archive_root: Path, results: Path, cells: Iterable[str]) -> dict[str, dict]:
    """Per cell, the prior components of its archived runs (both arms' bench.json, the same
    image digest as now, other files than now's); cells without such runs are left out."""
    archive_root, results = Path(archive_root), Path(results)
    if not archive_root.is_dir():
        return {}
    out = {}
    for cell in sorted(cells):
        now = [results / cell / "serve" / arm / "bench.json" for arm in ("untuned", "tuned")]
        if not all(p.is_file() for p in now):
            continue
        digest, mine = _digest(now[1]), {sha256_file(p) for p in now}
        pairs = []
        for run in archived.runs(archive_root):
            old = [run.path / cell / "serve" / arm / "bench.json" for arm in ("untuned", "tuned")]
            if not all(p.is_file() for p in old) or _digest(old[1]) != digest:
                continue
            if {sha256_file(p) for p in old} & mine:
                continue  # archived from these very results
            pairs.append((old[0], old[1]))
        if pairs:
            out[cell] = starts.prior_from_benches(pairs, comparison.METRICS)
    return out
