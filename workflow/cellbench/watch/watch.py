"""``cellbench watch``: one command for cron or a systemd timer. It checks every image's tag,
bumps the pins of those that moved (``cellbench images`` does the work), runs ``snakemake all``
(which reruns exactly the bumped images' cells, their archive and the report), builds the
history page of every label it touched, and sets each rerun cell against its previous archived
run with the pipeline's verdict.

Exit status (docs/watch.md):
  0  nothing moved, or what moved measured no worse and every GSM8K gate passed
  2  bad input (config, lock file, no Docker engine), before anything ran
  3  the run failed (snakemake all or the history exited non-zero, not for a gate)
  4  a verdict says worse (the summary lists each cell, arm, point and metric)
  5  a GSM8K gate failed (and maybe a verdict said worse too)
  75 another watch holds the lock (with --wait: it still did after that many seconds)
``--dry-run`` changes nothing: it says which tags moved, which cells would rerun and their
estimated wall time and GPU-hours (``cellbench plan``'s estimate), and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from filelock import FileLock, Timeout

from cellbench.config import cost
from cellbench.config import loader as cbconfig
from cellbench.runtime import images
from cellbench.watch import verdict

OK, BAD_INPUT, RUN_FAILED, WORSE, GATE_FAILED, LOCKED = 0, 2, 3, 4, 5, 75
LOCK_NAME = "results/.watch.lock"
SUMMARY_LINES = 20  # one screen


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cellbench watch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--configfile", default="config/local.yaml")
    p.add_argument("--dry-run", action="store_true", help="say what would run; change nothing")
    p.add_argument("--cores", type=int, default=2, help="snakemake --cores (default 2)")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for another watch's lock (default: exit at once)",
    )
    p.add_argument(
        "--snakemake",
        default=f"{sys.executable} -m snakemake",
        help="how to call Snakemake (default: this interpreter's module)",
    )
    return p  # fmt: skip


def moved_images(cfg: dict, lock_path: Path, client) -> list[dict]:
    """Per image whose tag no longer resolves to its pin (or that has none): its status row."""
    rows = images.image_status(cfg, images.load_lock(lock_path), client)
    bad = [r for r in rows if r["state"] == "unresolvable"]
    if bad:
        raise images.ImageError("; ".join(r["detail"] for r in bad))
    return [r for r in rows if r["state"] != "current"]


def affected_cells(cfg: dict, names: list[str]) -> list[cbconfig.Cell]:
    return [c for c in cbconfig.cells(cfg) if c.image in names]


def dry_run(cfg: dict, moved: list[dict], out: TextIO) -> int:
    if not moved:
        print("watch: every tag is where its pin is; nothing would run", file=out)
        return OK
    cells = affected_cells(cfg, [m["name"] for m in moved])
    total_s = total_h = 0.0
    for m in moved:
        print(f"watch: {m['name']} {m['state']}: {m['pinned'][:19]} -> {m['current'][:19]} "
              f"({m['ref']}); would run `cellbench images bump {m['name']}`", file=out)  # fmt: skip
    for cell in cells:
        est = cost.estimate_cell(cfg, cell, Path("results"))
        seconds = sum(job["seconds"] for job in est.values())
        hours = sum(job["gpu_hours"] for job in est.values())
        total_s, total_h = total_s + seconds, total_h + hours
        print(f"  would rerun {cell.cell_id}: ~{seconds / 60:.1f} min, {hours:.2f} GPU-hours",
              file=out)  # fmt: skip
    labels = sorted({cbconfig.archive_label(cfg, c.image) for c in cells})
    print(f"watch: {len(cells)} cell(s), ~{total_s / 60:.1f} min and {total_h:.2f} GPU-hours "
          f"(cellbench plan's estimate), then the report, the archive and history of "
          f"{', '.join(labels)}", file=out)  # fmt: skip
    return OK


def _snakemake(args: argparse.Namespace, cfg: dict, *targets: str) -> int:
    words = [*args.snakemake.split(), *targets, "--cores", str(args.cores)]
    if cfg["runtime"] == "docker" and int(cfg["gpus"]):
        words += ["--resources", f"gpu={cfg['gpus']}"]
    words += ["--configfile", args.configfile]
    print("watch: " + " ".join(words), flush=True)
    return subprocess.run(words).returncode


def failed_gates(cells: list[cbconfig.Cell]) -> list[str]:
    lines = []
    for cell in cells:
        path = Path(cell.path) / "gate.json"
        if not path.is_file():
            continue
        gate = json.loads(path.read_text())
        for check in gate.get("checks", []):
            if not check["passed"]:
                lines.append(f"GSM8K gate failed: {cell.cell_id} {check['arm']} "
                             f"{check['metric']} {check['check']} value {check['value']:.4f} "
                             f"limit {check['limit']:.4f}")  # fmt: skip
    return lines


def new_change_points(labels: list[str]) -> list[str]:
    """Otava's change points that start at each label's newest archived run (its history page
    must be built): the shifts this watch's run began."""
    import pandas as pd

    lines = []
    for label in labels:
        table = Path(f"results/history/{label}/change_points.csv")
        rows = Path(f"results/history/{label}/history.csv")
        if not table.is_file() or not rows.is_file():
            continue
        points, history = pd.read_csv(table), pd.read_csv(rows)
        if not len(points) or not len(history):
            continue
        newest = history.sort_values(["time", "run"]).run.iloc[-1]
        for r in points[points.run == newest].itertuples():
            lines.append(f"change point (Otava) at this run: {r.cell} {r.arm} {r.point} "
                         f"{r.metric} {r.shift_pct:+.1f}% p={r.pvalue:.2g}")  # fmt: skip
    return lines


def summary(cfg: dict, cells: list[cbconfig.Cell], out: TextIO) -> tuple[list[str], list[str]]:
    """(worse lines, gate lines), printed as one screen with the change points this run
    began (which set no exit status: a verdict or a gate does)."""
    worse, floor = [], float(cfg["report"]["min_change_pct"])
    for cell in cells:
        ref, rows = verdict.against_previous(Path("results/archive"), Path("results"),
                                             cell.cell_id, min_change_pct=floor)  # fmt: skip
        for r in verdict.worse(rows):
            worse.append(f"worse: {cell.cell_id} {r['arm']} {r['point']} {r['metric']} "
                         f"{r['change_pct']:+.1f}% against {ref}")  # fmt: skip
    gates = failed_gates(cells)
    labels = sorted({cbconfig.archive_label(cfg, c.image) for c in cells})
    lines = worse + gates + new_change_points(labels)
    for line in lines[:SUMMARY_LINES]:
        print(line, file=out)
    if len(lines) > SUMMARY_LINES:
        print(f"... and {len(lines) - SUMMARY_LINES} more: results/report/report.md", file=out)
    return worse, gates


def run(args: argparse.Namespace, cfg: dict, lock_path: Path, client, out: TextIO) -> int:
    moved = moved_images(cfg, lock_path, client)
    if args.dry_run:
        return dry_run(cfg, moved, out)
    if not moved:
        print("watch: every tag is where its pin is; nothing to run", file=out)
        return OK
    for m in moved:
        if m["state"] == "unpinned":
            images.cmd_lock(cfg, lock_path, client, out)
        else:
            images.cmd_bump(cfg, lock_path, m["name"], client, out)
    cells = affected_cells(cfg, [m["name"] for m in moved])
    code = _snakemake(args, cfg, "all")
    labels = sorted({cbconfig.archive_label(cfg, c.image) for c in cells})
    pages = [f"results/history/{label}/index.html" for label in labels]
    if code == 0 or all(Path(f"results/archive/{lb}/ARCHIVED.json").is_file() for lb in labels):
        history = _snakemake(args, cfg, *pages)
    else:
        history = 1
    worse, gates = summary(cfg, cells, out)
    if gates:
        return GATE_FAILED
    if code != 0 or history != 0:
        print(f"watch: the run failed (snakemake exit {code}, history exit {history}); "
              "see the job logs under results/logs/", file=out)  # fmt: skip
        return RUN_FAILED
    if worse:
        return WORSE
    print(f"watch: {len(cells)} cell(s) rerun, nothing worse; history: {', '.join(pages)}",
          file=out)  # fmt: skip
    return OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = sys.stdout
    try:
        cfg = cbconfig.load(args.configfile)
        if cfg["runtime"] != "docker":
            raise images.ImageError(f"{args.configfile} has runtime: {cfg['runtime']}, which "
                                    "runs no image: there is no tag to watch")  # fmt: skip
        lock_path = Path(cfg.get("image_lock", "config/images.lock.yaml"))
        images.load_lock(lock_path)
        Path(LOCK_NAME).parent.mkdir(parents=True, exist_ok=True)
        guard = FileLock(LOCK_NAME)
        try:
            guard.acquire(timeout=args.wait)
        except Timeout:
            print(f"cellbench watch: another watch holds {LOCK_NAME} (waited {args.wait:g} s); "
                  "nothing done. --wait SECONDS waits for it", file=sys.stderr)  # fmt: skip
            return LOCKED
        try:
            client = images.docker_client()
            return run(args, cfg, lock_path, client, out)
        finally:
            guard.release()
    except (cbconfig.ConfigError, images.ImageError) as exc:
        print(f"cellbench watch: error: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
