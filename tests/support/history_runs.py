"""A planted history: archived runs of one cell whose TPOT shifts at a known run, archived by
the real archive writer (so manifests, checks and reports are the pipeline's own)."""

from __future__ import annotations

from pathlib import Path

from cellbench.archive import write as archive

from support import result_fixtures as fx

CELL = "rocm7.2/tiny-a/tp1-ep1"


def archive_series(
    tmp: Path, tpots: list[float], *, versions: list[str] | None = None, cell: str = CELL
) -> Path:
    """One archived run per value of ``tpots`` (run i measured on day i), each with a digest
    and a server version of its own; returns the archive root."""
    root = tmp / "archive"
    for i, tpot in enumerate(tpots):
        res = tmp / f"results-{i}"
        digest = "sha256:" + f"{i:02d}" * 32
        version = (versions or [f"0.{28 + i}.0" for i in range(len(tpots))])[i]
        fx.write_tune(res, cell)
        for arm in ("untuned", "tuned"):
            points = [
                fx.point(64, 16, repeat=r, seq=r, ttft=50.0 + r, tpot=tpot + 0.05 * r,
                         concurrency=2, started_at=f"2026-11-{i + 1:02d}T02:00:0{r}+00:00")
                for r in range(3)
            ]  # fmt: skip
            fx.write_bench(res, cell, arm, points, image_digest=digest,
                           server={"launcher": "docker", "model": "m", "model_id": "m",
                                   "ready_s": 1.0, "version": {"observed_from": "GET /version",
                                                       "version": version}})  # fmt: skip
            fx.write_gsm8k(res, cell, arm, [True, False, True, True] * 5)
        archive.build_run(cell.split("/")[0], res, [cell], {cell.split("/")[0]: digest},
                          f"cfg{i}", root)  # fmt: skip
    return root
