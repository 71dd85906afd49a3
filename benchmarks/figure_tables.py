"""Generated tables: one row per run or per batch size, computed from the runs' printed files."""

from __future__ import annotations

import re

from figure_sources import Sources, bvv_rows, card, search, span, vllm_ops


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _run_files(src: Sources, pattern: str) -> list[str]:
    """Files under benchmarks/results/ matching a glob, by run number."""
    found = (src.root / "benchmarks/results").glob(pattern)
    names = [p.name for p in found if p.is_file()]

    def run_no(n: str) -> tuple[int, str]:
        m = re.search(r"_run(\d+)", n)
        return (int(m[1]) if m else 0, n)

    return sorted(names, key=run_no)


def _sbs(text: str) -> tuple[list[float], list[float]]:
    """def/exh and def/vllm of the last side-by-side table a tuner run printed."""
    num = r"\s+[\d.]+"
    row = re.compile(
        rf"^\s*(\d+){num}\s+\d+{num} \|{num}{num}\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)"
    )
    de, dv = {}, {}
    for line in text.splitlines():
        m = row.match(line)
        if m:
            dv[int(m[1])] = float(m[2])
            if m[4] != "-":
                de[int(m[1])] = float(m[4])
    return list(de.values()), list(dv.values())


def tuner_runs(src: Sources) -> str:
    """The builtin kernel's tuner runs: walls of both modes and how the picks compare."""
    rows = []
    for name in _run_files(src, "tuner_h200_*_run*.txt"):
        text = src.text(name)
        dtype = search(src, name, r"^== (\w+):")[1]
        sizes = search(src, name, r"^batch_sizes: \[(.*)\]")[1].count(",") + 1
        d = re.findall(r"^\s*default: wall ([\d.]+) s.*complete=(\w+)", text, re.M)
        e = re.findall(r"^exhaustive: wall ([\d.]+) s.*complete=(\w+)", text, re.M)
        de, dv = _sbs(text)
        ratio = f"{float(d[-1][0]) / float(e[-1][0]):.3f}" if d and e else "-"
        rows.append(
            [
                f"`{name}`",
                card(src, name),
                dtype,
                str(sizes),
                d[-1][0] if d else "-",
                f"{e[-1][0]}{'' if e[-1][1] == 'True' else ' (incomplete)'}" if e else "-",
                ratio,
                span(de) if de else "-",
                span(dv) if dv else "-",
            ]
        )
    header = ["run file", "card", "dtype", "batch sizes", "default wall s", "exhaustive wall s"]
    header += ["default/exhaustive wall", "default pick / exhaustive's", "default pick / shipped"]
    return _md(header, rows)


KERNEL_ROW = re.compile(
    r"^\| (bf16|fp8_block) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)% \|"
    r" [\d.]+% \| ([\d.]+)% \|"
)


def _kernel_rows(src: Sources, name: str) -> list[tuple[str, ...]]:
    rows = [m.groups() for m in map(KERNEL_ROW.match, src.text(name).splitlines()) if m]
    if not rows:
        raise LookupError(f"{src.path(name)}: no main-table rows")
    return rows


def kernel_runs(src: Sources) -> str:
    """The builtin kernel's main tables, one row per run, dtype and batch size."""
    out = []
    for name in _run_files(src, "kernel_h200_*_run*.txt"):
        ceil = search(
            src, name, r"^# ceilings: copy (\d+) GB/s.*?read (\d+) GB/s.*?bf16 matmul (\d+)"
        )
        try:
            rows = _kernel_rows(src, name)
        except LookupError:
            continue  # a run that printed only its variants' side tables
        for dtype, m, gemms, fused, ratio, roof, flop in rows:
            run = re.search(r"_run(\d+)", name)[1]
            out.append(
                [run, card(src, name), ceil[2], ceil[3], dtype, m, gemms, fused, ratio, roof, flop]
            )
    header = ["run", "card", "read GB/s", "bf16 matmul TFLOP/s", "dtype", "M", "GEMMs us"]
    header += ["whole call us", "whole/GEMMs", "GEMMs % of read floor", "GEMMs % of matmul"]
    return _md(header, out)


def bvv_table(src: Sources, name: str) -> str:
    """A builtin-vs-vLLM run, one row per batch size, with its card and what vLLM's side ran."""
    rows = bvv_rows(src, name)
    body = [
        [
            str(m),
            f"{r['vllm_us']:.2f}",
            f"{r['new']:.3f}",
            f"{r['gemms']:.3f}",
            f"{r['spread']:.3f}",
        ]
        for m, r in rows.items()
    ]
    head = ["M", "vLLM us", "builtin/vLLM, whole call", "GEMMs alone", "spread"]
    note = f"Card: {card(src, name)}; vLLM's side: {vllm_ops(src, name)}.\n\n"
    return note + _md(head, body)


def path_choice(src: Sources, name: str) -> str:
    """A tuner summary's picks per batch size: gain over the default rule, and the kept config
    timed on both paths where the tuner measured them."""
    import json

    rows = []
    for m, e in json.loads(src.text(name))["entries"].items():
        pc = e.get("path_choice") or {}
        both = [f"{pc['grouped_us']:.1f}", f"{pc['decode_us']:.1f}"] if pc else ["-", "-"]
        gain = f"{e['improvement_pct']:+.1f}"
        rows.append([m, e["config_name"], gain, *both, pc.get("path", e["kernel_path"])])
    head = ["M", "pick", "gain over the default rule %", "grouped us", "few-token us", "path"]
    return _md(head, rows)


def moe_share(src: Sources, name: str) -> str:
    """moe_share.py's bound on the MoE kernel's part of each point's TPOT."""
    rows = [
        [c.strip() for c in line.split("|")]
        for line in src.text(name).splitlines()
        if "@c" in line and line.count("|") == 4
    ]
    if not rows:
        raise LookupError(f"{src.path(name)}: no points")
    head = ["point (ISL-OSL @c)", "arm", "TPOT mean (min-max), ms", "MoE bound, ms", "share"]
    return _md(head, rows)


PEER_METRICS = ("ttft", "tpot", "itl", "e2el", "output_throughput")


def peer_ratios(src: Sources, name: str, conc: str, metric: str) -> list[float]:
    """Ours over vLLM's, per repeat, for one metric at one concurrency of a peer.json."""
    import json

    rows = [r for r in json.loads(src.text(name))["rows"] if r["concurrency"] == int(conc)]
    return [r["ours"][metric] / r["vllm"][metric] for r in rows if r["vllm"][metric] > 0]


def peer_table(src: Sources, name: str) -> str:
    """The peer run's table as peer_vllm_bench_serve.py prints it (median [min, max])."""
    import json
    import statistics

    d = json.loads(src.text(name))
    out = []
    for conc in sorted({r["concurrency"] for r in d["rows"]}):
        cells = []
        for m in PEER_METRICS:
            v = peer_ratios(src, name, str(conc), m)
            cells.append(f"{statistics.median(v):.3f} [{min(v):.3f}, {max(v):.3f}]")
        mine = [r for r in d["rows"] if r["concurrency"] == conc]
        ours = sum(r["ours"]["completed"] for r in mine)
        theirs = sum(r["vllm"]["completed"] for r in mine)
        out.append([str(conc), *cells, f"{ours:.0f} / {theirs:.0f}"])
    head = ["concurrency", "TTFT", "TPOT", "ITL", "E2EL", "output tok/s", "completed (ours / vLLM)"]
    return _md(head, out)


def peer_range(src: Sources, name: str, conc: str, metric: str) -> str:
    """A metric's ours/vLLM ratio, lowest to highest over the repeats."""
    v = peer_ratios(src, name, conc, metric)
    return f"{min(v):.2f}-{max(v):.2f}"


def peer_medians(src: Sources, name: str, conc: str) -> str:
    """The latency metrics' median ratios at one concurrency, lowest to highest."""
    import statistics

    meds = [statistics.median(peer_ratios(src, name, conc, m)) for m in PEER_METRICS[:4]]
    return f"{min(meds):.3f}-{max(meds):.3f}"


TABLES = {
    "peer-table": peer_table,
    "peer-range": peer_range,
    "peer-medians": peer_medians,
    "moe-share": moe_share,
    "path-choice": path_choice,
    "tuner-runs": tuner_runs,
    "kernel-runs": kernel_runs,
    "bvv-table": bvv_table,
}
