"""Calibration of the serving verdict on real servers: A/A tables and planted-change tables.

Each table is one real two-arm serve job (``python -m cellbench.serve``, the serve_pair rule's
own job built from a config by ``cellbench.config.jobargs``): fresh servers per arm each
round, arms interleaved, sequential stopping over starts, exactly as the workflow runs it. The
table's verdicts are the report's (``cellbench.stats.comparison.compare_serve``), with no
archive priors (each table is a first run).

- **A/A**: the tuned arm's config file holds, for every token count, exactly the launch
  config vLLM's default rule gives the untuned arm (``config_lookup.default_config``): both
  arms run the same kernel settings, and any row called better or worse is a false change.
- **Planted**: the tuned arm's file holds one deliberately slow launch config for every token
  count (``--planted-entry``, a real setting the server reads and the stage checks it
  loaded); its size is measured separately (``--measure-planted``: one job of many starts,
  no stopping) and recorded beside the tables.

Writes ``OUT/tables.jsonl`` (one line per table: kind, wall seconds, rows with verdicts) and
``OUT/summary.json`` (false-change rate per table with its Clopper-Pearson interval, power at
the planted row, the planted size measured separately, the stated detectable change).

    python benchmarks/calibrate_real_servers.py --config config/local.yaml \\
        --model tiny-qwen3-moe --aa 100 --planted 40 --measure-planted 8 --workers 8 \\
        --out benchmarks/results/calibration_real_servers

Run from a folder holding ``results/assets/models/MODEL`` (built here when missing).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from cellbench.common.canonical import canonical
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.runtime.pins import Pins
from cellbench.stats import calibration, comparison
from cellbench.tune.kernels import config_lookup

# The metrics a table's rows are drawn on (the report's verdict columns).
METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "output_throughput")
CHANGED = ("better", "worse")


def pair_job(config_path: str, model: str, overrides: dict) -> tuple[dict, dict]:
    """The serve_pair rule's job for ``model``'s cell in ``config_path``, its serve section
    updated by ``overrides``; no GSM8K (the serving verdict is what is calibrated)."""
    config = cbconfig.load(config_path)
    config["serve"].update(overrides)
    cbconfig.validate(config)
    cell = next(c for c in cbconfig.cells(config) if c.model == model)
    wildcards = SimpleNamespace(image=cell.image, model=model, tp=str(cell.tp), ep=str(cell.ep))
    job = jobargs.serve_job(config, Pins.for_config(config), wildcards, "pair")
    job["gsm8k"] = False
    host = json.loads(jobargs.serve_host(config, {}))
    return job, host


def run_table(job: dict, host: dict, tuned_dir: Path, out: Path, cpus: list[int] | None) -> dict:
    """One real serve job; returns both arms' bench.json documents."""
    out.mkdir(parents=True, exist_ok=True)
    host = {**host, "tuned_config_dir": str(tuned_dir), "lease_dir": str(out / "leases")}
    cmd = [sys.executable, "-m", "cellbench.serve", "--job", canonical(job),
           "--host", canonical(host), "--out-dir", str(out / "serve")]  # fmt: skip
    if cpus:  # each worker on its own cores: tables side by side do not share a core
        cmd = ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus) if cpus else os.cpu_count()),
           # the CPU server, as the embedded default runs it, also on a machine with a GPU
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    with (out / "serve.log").open("w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        tail = (out / "serve.log").read_text()[-2000:]
        raise RuntimeError(f"serve job in {out} exited {rc}:\n{tail}")
    return {
        arm: json.loads((out / "serve" / arm / "bench.json").read_text())
        for arm in ("untuned", "tuned")
    }


def verdict_rows(benches: dict, margin_pct: float) -> list[dict]:
    """The report's verdict rows (tuned against untuned) on the table's metrics."""
    a = pd.DataFrame(benches["untuned"]["points"])
    b = pd.DataFrame(benches["tuned"]["points"])
    rows = comparison.compare_serve(a, b, min_change_pct=margin_pct)
    keep = ("isl", "osl", "max_concurrency", "metric", "verdict", "change_pct", "mdc_pct",
            "starts_used", "stop_reason")  # fmt: skip
    return [{k: r.get(k) for k in keep if k in r} for r in rows if r["metric"] in METRICS]


def _jsonable(x):
    if isinstance(x, float) and x != x:
        return None
    if hasattr(x, "item"):
        return _jsonable(x.item())
    return x


# Smaller tiles than the default rule's: more programs per call, each one interpreted.
SLOW_ENTRY = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1}
MAX_TOKENS = 4096


def write_table(folder: Path, job: dict, entry: dict | None) -> Path:
    """A tuned folder for the job's model: vLLM's file for its MoE shape, keyed by every
    token count up to MAX_TOKENS (so the nearest key is the count itself), holding the
    default rule's config per count (``entry`` None) or ``entry`` everywhere."""
    model = json.loads((Path(job["model"]) / "config.json").read_text())
    experts = int(model.get("num_local_experts") or model["num_experts"])
    n, k = int(model["moe_intermediate_size"]), int(model["hidden_size"])
    topk = int(model["num_experts_per_tok"])
    table = {
        str(m): entry or config_lookup.default_config(m, experts, n, k, topk)
        for m in range(1, MAX_TOKENS + 1)
    }
    folder.mkdir(parents=True, exist_ok=True)
    name = config_lookup.config_file_name(experts, n, None, None, "CPU_TRITON_INTERPRET")
    (folder / name).write_text(json.dumps(table) + "\n")
    return folder


class Pool:
    """Cores handed to workers, so tables running side by side never share one."""

    def __init__(self, workers: int, per_worker: int):
        total = os.cpu_count() or 1
        self.free = [
            list(range(i * per_worker, (i + 1) * per_worker))
            for i in range(workers)
            if (i + 1) * per_worker <= total
        ] or [None]
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            return self.free.pop()

    def give(self, cpus) -> None:
        with self.lock:
            self.free.append(cpus)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config/local.yaml")
    p.add_argument("--model", default="tiny-qwen3-moe")
    p.add_argument("--aa", type=int, default=100, help="A/A tables")
    p.add_argument("--planted", type=int, default=40, help="planted-change tables")
    p.add_argument(
        "--planted-entry",
        default=json.dumps(SLOW_ENTRY),
        help="JSON: the planted arm's launch config, used for every token count",
    )
    p.add_argument("--measure-planted", type=int, default=0, help="starts of the long job")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--cores-per-worker", type=int, default=2)
    p.add_argument("--serve", default="{}", help="JSON: serve-section overrides")
    p.add_argument("--margin-pct", type=float, default=2.0)
    p.add_argument("--deadline-s", type=float, default=0, help="start no table after this")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    overrides = json.loads(args.serve)
    job, host = pair_job(args.config, args.model, overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("CALIBRATION_WORK", "/tmp/calibration-work"))
    same = write_table(work / "tuned-same", job, None)
    slow = write_table(work / "tuned-planted", job, json.loads(args.planted_entry))
    pool = Pool(args.workers, args.cores_per_worker)
    t0 = time.monotonic()
    done = {"aa": 0, "planted": 0}
    lines = (args.out / "tables.jsonl").open("a")

    def one(kind: str, i: int, the_job: dict) -> dict | None:
        if args.deadline_s and time.monotonic() - t0 > args.deadline_s:
            return None
        cpus = pool.take()
        try:
            t = time.monotonic()
            tuned = same if kind == "aa" else slow
            try:
                benches = run_table(the_job, host, tuned, work / f"{kind}-{i:04d}", cpus)
            except RuntimeError as exc:  # a failed job is counted, never a table
                print(f"[calibrate] {kind} {i} FAILED: {exc}", flush=True)
                with pool.lock:
                    lines.write(json.dumps({"kind": kind, "table": i, "error": str(exc)[:500]}))
                    lines.write("\n")
                return None
            rows = verdict_rows(benches, args.margin_pct)
            rec = {"kind": kind, "table": i, "wall_s": round(time.monotonic() - t, 1),
                   "rows": [{k: _jsonable(v) for k, v in r.items()} for r in rows]}  # fmt: skip
        finally:
            pool.give(cpus)
        shutil.rmtree(work / f"{kind}-{i:04d}", ignore_errors=True)
        with pool.lock:
            lines.write(json.dumps(rec) + "\n")
            lines.flush()
            done[kind] += 1
            called = sum(r["verdict"] in CHANGED for r in rec["rows"])
            print(f"[calibrate] {kind} {i}: {called} of {len(rec['rows'])} rows called, "
                  f"{rec['wall_s']} s (done {done})", flush=True)  # fmt: skip
        return rec

    # A/A and planted tables alternate, so a drift of the machine touches both alike.
    todo = [("aa", i) for i in range(args.aa)] + [("planted", i) for i in range(args.planted)]
    counts = {"aa": args.aa, "planted": args.planted}
    todo.sort(key=lambda t: t[1] / counts[t[0]])
    with cf.ThreadPoolExecutor(max_workers=len(pool.free)) as ex:
        futures = []
        if args.measure_planted:
            long_job = {**job, "starts_min": args.measure_planted,
                        "starts_cap": args.measure_planted}  # fmt: skip
            long_job.pop("min_change_pct", None)
            futures.append(ex.submit(measure_size, long_job, host, slow, work, pool, args.out))
        futures += [ex.submit(one, kind, i, job) for kind, i in todo]
        for f in cf.as_completed(futures):
            f.result()
    lines.close()
    summary = summarise(args.out / "tables.jsonl", args.out / "size.json")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def measure_size(job, host, slow, work, pool, out: Path) -> dict:
    """The planted change's size, measured apart from the tables: one job at many starts."""
    cpus = pool.take()
    try:
        benches = run_table(job, host, slow, work / "size", cpus)
    finally:
        pool.give(cpus)
    a = pd.DataFrame(benches["untuned"]["points"])
    b = pd.DataFrame(benches["tuned"]["points"])
    size = {}
    for metric in METRICS:
        ga = a.groupby(["isl", "osl"])[metric].median()
        gb = b.groupby(["isl", "osl"])[metric].median()
        size[metric] = {f"{i}-{o}": round(100 * (gb[(i, o)] / ga[(i, o)] - 1), 2)
                        for i, o in ga.index}  # fmt: skip
    doc = {"starts": int(job["starts_cap"]), "change_pct_of_medians": size}
    (out / "size.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"[calibrate] planted size: {json.dumps(size)}", flush=True)
    return doc


def summarise(tables: Path, size: Path) -> dict:
    recs = [json.loads(line) for line in tables.read_text().splitlines() if line.strip()]
    out: dict = {"failed_jobs": sum("error" in r for r in recs)}
    recs = [r for r in recs if "error" not in r]
    aa = [r for r in recs if r["kind"] == "aa"]
    if aa:
        k = sum(any(x["verdict"] in CHANGED for x in r["rows"]) for r in aa)
        lo, hi = calibration.clopper_pearson(k, len(aa))
        rows = sum(len(r["rows"]) for r in aa)
        out["aa"] = {"tables": len(aa), "tables_with_a_false_change": k,
                     "false_change_rate": k / len(aa), "interval_95": [lo, hi],
                     "rows": rows, "rows_per_table": rows / len(aa),
                     "median_wall_s": float(pd.Series([r["wall_s"] for r in aa]).median()),
                     }  # fmt: skip
    planted = [r for r in recs if r["kind"] == "planted"]
    if planted:
        by_row: dict[str, list[str]] = {}
        mdc: dict[str, list[float]] = {}
        for r in planted:
            for x in r["rows"]:
                key = f"{x['isl']}-{x['osl']} {x['metric']}"
                by_row.setdefault(key, []).append(x["verdict"])
                if x.get("mdc_pct") is not None:
                    mdc.setdefault(key, []).append(x["mdc_pct"])
        power = {}
        for key, verdicts in sorted(by_row.items()):
            k = sum(v in CHANGED for v in verdicts)
            lo, hi = calibration.clopper_pearson(k, len(verdicts))
            power[key] = {"tables": len(verdicts), "called": k, "power": k / len(verdicts),
                          "interval_95": [lo, hi],
                          "median_stated_mdc_pct": float(pd.Series(mdc[key]).median())
                          if mdc.get(key) else None}  # fmt: skip
        out["planted"] = {"tables": len(planted), "per_row": power}
    if size.exists():
        out["planted_size"] = json.loads(size.read_text())
    return out


def _ci(pair: list[float]) -> str:
    return f"[{100 * pair[0]:.1f}%, {100 * pair[1]:.1f}%]"


def markdown(summary: dict, title: str) -> str:
    """The calibration's table, written from its summary (``--report``)."""
    lines = [f"# {title}", "", "Written by `benchmarks/calibrate_real_servers.py --report` from "
             "`summary.json`; the folder of the same name holds every table.", ""]  # fmt: skip
    aa = summary.get("aa")
    if aa:
        lines += [
            "## A/A tables (both arms the same settings)", "",
            "| tables | rows per table | tables with a false change | false-change rate "
            "(95% interval) | median table wall |",
            "| --- | --- | --- | --- | --- |",
            f"| {aa['tables']} | {aa['rows_per_table']:g} | {aa['tables_with_a_false_change']} "
            f"| {100 * aa['false_change_rate']:.1f}% {_ci(aa['interval_95'])} "
            f"| {aa['median_wall_s']:.0f} s |", "",
        ]  # fmt: skip
    planted = summary.get("planted")
    size = summary.get("planted_size", {}).get("change_pct_of_medians", {})
    if planted:
        lines += [
            "## Planted change (the tuned arm's launch config made slow)", "",
            "| row | planted size (separate run) | tables | called | power (95% interval) "
            "| median stated detectable change |",
            "| --- | --- | --- | --- | --- | --- |",
        ]  # fmt: skip
        for key, row in planted["per_row"].items():
            point, metric = key.split(" ")
            planted_pct = size.get(metric, {}).get(point)
            shown = f"{planted_pct:+.1f}%" if planted_pct is not None else "n/a"
            mdc = row["median_stated_mdc_pct"]
            lines.append(
                f"| {key} | {shown} | {row['tables']} | {row['called']} "
                f"| {100 * row['power']:.0f}% {_ci(row['interval_95'])} "
                f"| {'n/a' if mdc is None else f'{mdc:.0f}%'} |"
            )
        lines.append("")
    failed = summary.get("failed_jobs", 0)
    lines.append(f"Serve jobs that failed (not counted as tables): {failed}.")
    return "\n".join(lines) + "\n"


def report(folder: Path, page: Path, title: str) -> None:
    summary = summarise(folder / "tables.jsonl", folder / "size.json")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    page.write_text(markdown(summary, title))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--report"]:
        # --report FOLDER PAGE TITLE: summary.json and the page from a run's tables.jsonl
        report(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
        raise SystemExit(0)
    raise SystemExit(main())
