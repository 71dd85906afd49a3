"""Recompute each headline figure of benchmarks/README.md from the committed outputs.

Each figure is computed here from a file under benchmarks/results/ (JSON where the run wrote
one, else the printed .txt), printed with that file's name, and, with --check, looked up
verbatim in benchmarks/README.md: a headline whose figure no longer matches its file, or a
figure dropped from the README, makes the check fail. Needs only the Python standard library
and, for the outputs that left the tree (issue 31: full JSON outputs and raw logs), git: such a
file is read as `git show HISTORY:benchmarks/results/NAME`, and its row names that commit.

    python3 benchmarks/headline_figures.py            # the table
    python3 benchmarks/headline_figures.py --check    # and check README.md quotes each one
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"

# Qwen3-30B-A3B at TP=1, as kernel_vs_roofline.py runs it: 2 * M * topk * 3 * N * K FLOPs per call.
E, N, K, TOPK = 128, 768, 2048, 8


def flops(m: int) -> float:
    return 2.0 * m * TOPK * 3 * N * K


# The last commit whose tree held every output under benchmarks/results/ (before issue 31 took
# the full JSON outputs and raw logs out of the tree). A file missing here is read from it.
HISTORY = "03662fa1a97bfa2fd41bae039ea544345f27835c"


def raw(name: str) -> bytes:
    """The bytes of benchmarks/results/NAME: from the tree, else from commit HISTORY."""
    path = RESULTS / name
    if path.exists():
        data = path.read_bytes()
    else:
        data = subprocess.run(
            ["git", "show", f"{HISTORY}:benchmarks/results/{name}"],
            cwd=HERE,
            capture_output=True,
            check=True,
        ).stdout
    return gzip.decompress(data) if name.endswith(".gz") else data


def load_json(name: str):
    return json.loads(raw(name))


def load_jsonl(name: str) -> list[dict]:
    lines = io.StringIO(raw(name).decode())
    return [json.loads(line) for line in lines if line.strip()]


def text(name: str) -> str:
    return raw(name).decode()


def where(src: str) -> str:
    """The source column: each file, with '@ COMMIT' where it is read from git history."""
    return ", ".join(
        f if (RESULTS / f).exists() else f"{f} @ {HISTORY[:7]}" for f in src.split(", ")
    )


def span(values, fmt: str = "{:.3f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def pct(x: float, digits: int = 1) -> str:
    return f"{x * 100:.{digits}f} %"


def walls(t: dict, exh_label: str = "") -> str:
    """'D s against E s (D/E)', as the README quotes a default-vs-exhaustive wall pair."""
    d, e = t["wall_def"], t["wall_exh"]
    return f"{d:.1f} s against {exh_label}{e:.1f} s ({d / e:.3f})"


# ---- tuner outputs -------------------------------------------------------------------------


def tuner(name: str) -> dict:
    """Walls, wall ratio and side-by-side ratios of a tuner_h200 JSON."""
    d = load_json(name)
    out = {"wall_def": d["default"]["seconds"]["wall"], "gpu_def": d["default"]["seconds"]["gpu"]}
    out["setup_def"] = d["default"]["seconds"].get("setup")
    out["wait_def"] = d["default"]["seconds"].get("compile_wait")
    exh = d.get("exhaustive") or {}
    out["wall_exh"] = (exh.get("seconds") or {}).get("wall")
    out["space_exh"] = (exh.get("space") or {}).get("size")
    de, dv = {}, {}
    for m, row in (d.get("side_by_side") or {}).items():
        if row.get("exhaustive"):
            de[int(m)] = row["default"]["median_us"] / row["exhaustive"]["median_us"]
        if row.get("vllm"):
            dv[int(m)] = row["default"]["median_us"] / row["vllm"]["median_us"]
    out["def_exh"], out["def_vllm"] = de, dv
    out["entries_def"] = d["default"]["entries"]
    out["entries_exh"] = exh.get("entries") or {}
    out["picks"] = d.get("picks") or {}
    return out


def tuner_txt_sbs(name: str) -> tuple[dict, dict]:
    """def/exh and def/vllm of the last side-by-side table a tuner_h200 .txt printed."""
    de, dv = {}, {}
    # M, tuned_us, new_k, wall_s | def, vllm, def/vllm, exh, def/exh, ...
    num = r"\s+[\d.]+"
    row = re.compile(
        rf"^\s*(\d+){num}\s+\d+{num} \|{num}{num}\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)"
    )
    for line in text(name).splitlines():
        m = row.match(line)
        if m:
            dv[int(m[1])] = float(m[2])
            if m[4] != "-":
                de[int(m[1])] = float(m[4])
    return de, dv


def txt_wall(name: str, mode: str) -> float:
    m = re.search(rf"^\s*{mode}: wall ([\d.]+) s", text(name), re.M)
    return float(m[1])


def txt_setup(name: str, mode: str) -> float:
    m = re.search(rf"^\s*{mode}: wall [\d.]+ s.*?setup ([\d.]+) s", text(name), re.M)
    return float(m[1])


def txt_exh_tuned_us(name: str, m_wanted: int) -> float:
    """The exhaustive mode's tuned_us at one M, from the per-mode summary table of a .txt."""
    summary = r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+|None)\s+([\d.]+|None)\s+[\d.]+\s+M\d+_"
    rows = re.findall(summary, text(name), re.M)
    # the summary tables come in order default, exhaustive: take the last row for that M
    found = [float(us) for m, us, _, _ in rows if int(m) == m_wanted]
    return found[-1]


# ---- kernel outputs ------------------------------------------------------------------------


def kernel_row(name: str, dtype: str, m: int) -> dict:
    for row in load_json(name)["rows"]:
        if row["dtype"] == dtype and row["M"] == m:
            return row
    raise KeyError(f"{name}: no main-table row for {dtype} M={m}")


# ---- the figures ---------------------------------------------------------------------------


def figures() -> list[tuple[str, str, str]]:
    """(what, figure as the README quotes it, source files)."""
    out: list[tuple[str, str, str]] = []

    def add(what: str, fig: str, *sources: str) -> None:
        out.append((what, fig, ", ".join(sources)))

    # Kernel, run 4 (shipped configs, TMA weight tiles from 64 pairs).
    k4 = "kernel_h200_2026-12-02_run4.json"
    ms = (1, 16, 64, 256, 1024, 4096)
    add(
        "bf16 two GEMMs, us, M=1..4096 (run 4)",
        " / ".join(f"{kernel_row(k4, 'bf16', m)['gemms_us']:.1f}" for m in ms),
        k4,
    )
    add(
        "bf16 whole call / GEMMs at M>=16 (run 4)",
        span([kernel_row(k4, "bf16", m)["fused_over_gemms"] for m in ms[1:]], "{:.2f}") + "x",
        k4,
    )
    add(
        "fp8 block whole call / GEMMs at M>=16 (run 4)",
        span([kernel_row(k4, "fp8_block", m)["fused_over_gemms"] for m in ms[1:]], "{:.2f}") + "x",
        k4,
    )
    add(
        "bf16 M=4096 GEMMs, fraction of the matmul ceiling (run 4)",
        pct(kernel_row(k4, "bf16", 4096)["flop_frac_gemms"]),
        k4,
    )
    r1 = kernel_row(k4, "bf16", 1)
    add("bf16 M=1 GEMMs, fraction of the 2 GiB read-rate floor (run 4)", pct(r1["roof_gemms"]), k4)
    read75 = load_json(k4)["ceilings"]["read_75MB_GBps"] * 1e9
    add(
        "bf16 M=1 GEMMs' byte rate over one 75.5 MB torch read (run 4)",
        pct(r1["MB"] * 1e6 / (r1["gemms_us"] * 1e-6) / read75, 0),
        k4,
    )

    k3 = "kernel_h200_2026-12-02_run3_variants.json"
    d3 = load_json(k3)
    best = min(
        (r for r in d3["tma_sweep"] if r["dtype"] == "bf16" and r["M"] == 4096),
        key=lambda r: r["tma"],
    )
    frac = flops(4096) / (d3["ceilings"]["bf16_TFLOPs"] * 1e12) / (best["tma"] * 1e-6)
    add(
        "bf16 M=4096 best TMA sweep config, us and fraction of matmul (run 3)",
        f"{best['tma']:.1f} us = " + pct(frac),
        k3,
    )

    # Tuner, run 5 and the 18-batch-size runs 3-4.
    t5n = "tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json"
    t5 = tuner(t5n)
    add("run 5 walls, default / exhaustive (ratio)", walls(t5), t5n)
    add("run 5 default/exhaustive, side by side", span(t5["def_exh"].values()) + "x", t5n)
    add("run 5 default/shipped, side by side", span(t5["def_vllm"].values()) + "x", t5n)
    t3n = "tuner_h200_2026-12-02_bf16-default18_run3.json"
    t4n = "tuner_h200_2026-12-02_bf16-default18_run4.txt"
    add(
        "18 batch sizes, default wall (runs 3, 4)",
        f"{tuner(t3n)['wall_def']:.1f} and {txt_wall(t4n, 'default'):.1f} s",
        t3n,
        t4n,
    )

    # Runs 12-14.
    t12n = "tuner_h200_2026-12-03_bf16-6ms-exhaustive_run12.json"
    t13n = "tuner_h200_2026-12-03_bf16-6ms-default-sweep_run13.json"
    t14n = "tuner_h200_2026-12-03_bf16-6ms-default_run14.json"
    t12, t13, t14 = tuner(t12n), tuner(t13n), tuner(t14n)
    add("run 12 wall ratio, same run", f"{t12['wall_def'] / t12['wall_exh']:.3f}", t12n)
    walls1314 = [t13["wall_def"], t14["wall_def"]]
    add("runs 13-14 default wall, 6 batch sizes", span(walls1314, "{:.1f}") + " s", t13n, t14n)
    add(
        "runs 13-14 default wall over run 12's exhaustive",
        span([w / t12["wall_exh"] for w in walls1314]),
        t12n,
        t13n,
        t14n,
    )
    add("run 14 M=1 default/exhaustive", f"{t14['def_exh'][1]:.3f}", t14n)

    # Runs 15-16.
    t15n = "tuner_h200_2026-12-03_bf16-6ms-both_run15.json"
    t16n = "tuner_h200_2026-12-03_fp8-6ms-both_run16.json"
    t15, t16 = tuner(t15n), tuner(t16n)
    add("run 15 bf16 walls (ratio)", walls(t15, "exhaustive's "), t15n)
    add("run 15 bf16 default/exhaustive", span(t15["def_exh"].values()) + "x", t15n)
    add("run 15 bf16 default/shipped", span(t15["def_vllm"].values()) + "x", t15n)
    add("run 16 fp8 default/exhaustive", span(t16["def_exh"].values()) + "x", t16n)
    add("run 16 fp8 walls (ratio)", walls(t16), t16n)
    add("run 16 fp8 exhaustive space", f"{t16['space_exh']} configs", t16n)
    add(
        "run 16 fp8 default setup + compile waits",
        f"{t16['setup_def']:.1f} + {t16['wait_def']:.1f} s",
        t16n,
    )

    # Runs 18-20.
    k20 = "kernel_h200_2026-12-03_run20_persistent-rule.json"
    add(
        "bf16 M=4096 GEMMs, fraction of matmul, persistence rule on (run 20)",
        pct(kernel_row(k20, "bf16", 4096)["flop_frac_gemms"]),
        k20,
    )
    before = [
        "kernel_h200_2026-12-02_run4.json",
        "kernel_h200_2026-12-02_run6.json",
        "kernel_h200_2026-12-02_run7_chain-preload.json",
        "kernel_h200_2026-12-03_run11_decode-slice.json",
        "kernel_h200_2026-12-03_run18_persistent.json",
    ]
    fr = [kernel_row(f, "bf16", 4096)["flop_frac_gemms"] * 100 for f in before]
    add(
        "bf16 M=4096 GEMMs, fraction of matmul, one tile per program (runs 4-18 main tables)",
        span(fr, "{:.1f}") + " %",
        *before,
    )
    t19n = "tuner_h200_2026-12-03_bf16-6ms-both_run19.txt"
    add(
        "exhaustive's M=4096 call, us (run 15 -> run 19)",
        f"{t15['entries_exh']['4096']['time_us']:.1f} to {txt_exh_tuned_us(t19n, 4096):.1f} us",
        t15n,
        t19n,
    )
    t20n = "tuner_h200_2026-12-03_bf16-6ms-both_run20.json"
    t20 = tuner(t20n)
    de19, dv19 = tuner_txt_sbs(t19n)
    add(
        "runs 19-20 default/exhaustive",
        span([*de19.values(), *t20["def_exh"].values()]) + "x",
        t19n,
        t20n,
    )
    add(
        "runs 19-20 default/shipped",
        span([*dv19.values(), *t20["def_vllm"].values()]) + "x",
        t19n,
        t20n,
    )
    r19 = re.search(r"= ([\d.]+) / ([\d.]+) = ([\d.]+)", text(t19n))
    add("run 19 wall ratio", r19[3], t19n)
    five = [m for m in t20["entries_exh"] if int(m) <= 1024]
    ratio5 = sum(t20["entries_def"][m]["tune_wall_s"] for m in five) / sum(
        t20["entries_exh"][m]["tune_wall_s"] for m in five
    )
    add("run 20 wall ratio over the five batch sizes exhaustive finished", f"{ratio5:.3f}", t20n)
    add(
        "default setup, run 20 (weights drawn on the GPU) and run 19",
        f"{t20['setup_def']:.1f} s, was {txt_setup(t19n, 'default'):.1f} s",
        t20n,
        t19n,
    )

    # Runs 21-23.
    cw = "compile_workers_h200_2026-12-03_run22.json"
    runs = load_json(cw)["runs"]

    def median_last_ready(kind: str) -> float:
        v = sorted(r["startup"]["last_ready"] for r in runs if r["kind"] == kind)
        return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2

    add(
        "compile workers ready, forked compile-only vs spawned (medians of last_ready)",
        f"{median_last_ready('compile-only forked'):.2f} s "
        f"({median_last_ready('compile-only spawned'):.1f}-"
        f"{median_last_ready('opens GPU'):.1f} s spawned)",
        cw,
    )
    t22n = "tuner_h200_2026-12-03_fp8-6ms-both_run22.json"
    t22 = tuner(t22n)
    add("run 22 fp8 walls (ratio)", walls(t22), t22n)
    add("run 22 fp8 default/exhaustive", span(t22["def_exh"].values()) + "x", t22n)
    t23n = "tuner_h200_2026-12-03_bf16-6ms-both_run23.json"
    t23 = tuner(t23n)
    add("run 23 bf16 walls (ratio)", walls(t23, "exhaustive's "), t23n)
    add("run 23 default/exhaustive", span(t23["def_exh"].values()) + "x", t23n)
    add("run 23 default/shipped", span(t23["def_vllm"].values()) + "x", t23n)
    log23 = "tuner_h200_2026-12-03_bf16-6ms-both_run23_log-default.jsonl"
    ties = {
        r["config"]["num_stages"]: r["time_us"]
        for r in load_jsonl(log23)
        if r.get("stage") == "tiebreak" and r["m"] == 4096
    }
    add(
        "run 23 M=4096 tie re-timing: shipped (s4) over the pick (s3)",
        pct(ties[4] / ties[3] - 1),
        log23,
    )

    # Runs 25-27.
    t25n = "tuner_h200_2026-12-03_fp8-6ms-both_run25.json"
    t25sn = "tuner_h200_2026-12-03_fp8-6ms-default-noshared_run25.json"
    t25, t25s = tuner(t25n), tuner(t25sn)
    add(
        "run 25 fp8 default, shared kernels in the workers vs not: wall",
        f"{t25['wall_def']:.1f} s against {t25s['wall_def']:.1f} s",
        t25n,
        t25sn,
    )
    add(
        "run 25 fp8 default, shared kernels in the workers vs not: GPU-seconds",
        f"{t25['gpu_def']:.1f} GPU-seconds against {t25s['gpu_def']:.1f}",
        t25n,
        t25sn,
    )
    add("run 25 fp8 M=256 default/exhaustive", pct(t25["def_exh"][256] - 1), t25n)
    t26n = "tuner_h200_2026-12-03_fp8-6ms-both_run26.json"
    t26 = tuner(t26n)
    add("run 26 fp8 default/exhaustive", span(t26["def_exh"].values()) + "x", t26n)
    add("run 26 fp8 walls (ratio)", walls(t26), t26n)
    t27n = "tuner_h200_2026-12-03_bf16-6ms-both_run27.json"
    t27 = tuner(t27n)
    add("run 27 bf16 default/exhaustive", span(t27["def_exh"].values()) + "x", t27n)
    add("run 27 bf16 walls (ratio)", walls(t27), t27n)
    t26bn = "tuner_h200_2026-12-03_bf16-18ms-default_run26.json"
    add("run 26 bf16, all 18 batch sizes, default wall", f"{tuner(t26bn)['wall_def']:.1f} s", t26bn)

    # Search replay (CPU) and what later GPU runs picked at fp8 M=4096.
    sr = "search_replay_2026-12-03_fp8.txt"
    m = re.search(r"^\s+4096\s.*\((\d+)/(\d+)\)$", text(sr), re.M)
    add("replay, fp8 M=4096: seeds that pick exhaustive's config", f"{m[1]} of {m[2]} seeds", sr)

    def name(c: dict) -> str:
        keys = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps")
        m, n, k, g, w = (c[key] for key in keys)
        return f"M{m}_N{n}_K{k}_G{g}_w{w}_s{c['num_stages']}"

    same = {}
    for run, t in (
        ("16", t16),
        ("21", tuner("tuner_h200_2026-12-03_fp8-6ms-both_run21.json")),
        ("22", t22),
        ("25", t25),
        ("26", t26),
    ):
        p = t["picks"]["4096"]
        same[run] = name(p["default"]) == name(p["exhaustive"])
    add(
        "GPU runs whose fp8 M=4096 default pick is exhaustive's",
        "runs "
        + " and ".join(r for r, s in same.items() if s)
        + "; not in runs "
        + ", ".join(r for r, s in same.items() if not s),
        "tuner_h200_2026-12-03_fp8-6ms-both_run{16,21,22,25,26}.json",
    )

    # Load generator.
    lg = "loadgen_accuracy_2026-12-02.txt"
    rows = {}
    for line in text(lg).splitlines():
        f = line.split()
        if f and f[0].isdigit() and "|" in line:
            cells = [c.split() for c in line.split("|")]
            errs = [abs(float(c[1])) for c in cells[1:5]]
            rows[int(f[0])] = (max(errs), float(cells[6][1]))
    add(
        "load generator, largest mean error at concurrency 256 / 512",
        f"<= {rows[256][0]:.2f} % at concurrency 256 and <= {rows[512][0]:.2f} % at 512",
        lg,
    )
    add("load generator, CPU cores used at concurrency 512", f"{rows[512][1]:.2f} of one core", lg)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="fail if README.md does not quote a figure verbatim"
    )
    args = ap.parse_args()
    readme = " ".join(README.read_text().split())  # line breaks in the README do not count
    missing = 0
    print(f"| headline | figure | source (benchmarks/results/; @ {HISTORY[:7]}: git history) "
          "| in README |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for what, fig, src in figures():
        found = fig in readme
        missing += not found
        print(f"| {what} | {fig} | {where(src)} | {'yes' if found else 'NO'} |")
    if args.check and missing:
        print(f"{missing} figure(s) not quoted verbatim in {README}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
