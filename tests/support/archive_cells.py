"""Whole cells of result files for archive tests, and checksums computed from the files."""

from __future__ import annotations

from pathlib import Path

from cellbench.common.atomicio import sha256_file

from support import result_fixtures as fx


def write_cell(res: Path, cell: str, ttft: float = 100.0, digest: str = fx.DIGEST) -> None:
    """A whole cell: tune summary, both arms' serving (3 server starts of one repeat, the
    arms interleaved, a small spread) and GSM8K."""
    fx.write_tune(res, cell)
    for side, (arm, shift) in enumerate((("untuned", 0.0), ("tuned", -10.0))):
        points = [
            fx.point(
                512,
                512,
                repeat=r,
                start=r,
                seq=2 * r + side,
                ttft=ttft + shift + r,
                tpot=30.0 + 0.1 * r,
            )  # fmt: skip
            for r in range(3)
        ]
        fx.write_bench(res, cell, arm, points, image_digest=digest)
        fx.write_gsm8k(res, cell, arm, [True, False, True, True] * 5)


def tree_checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, computed here, not read from any manifest."""
    return {
        str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()
    }
