"""Figure families for the tuner runs, the pipeline runs on a lent GPU and the settings the
code holds (render_figures.py merges them with figure_sources.FAMILIES)."""

from __future__ import annotations

import json
import re

from figure_sources import CARD, Sources, minutes, pytest_counts, search, span

# ---- the tuner on vLLM's kernel (tuner_vllm_kernel_*.txt) -----------------------------------


def _vk_header(line: str) -> list[list[str]]:
    """Column names per '|' section of a tuner_vllm_kernel header ('b/v ship' -> 'b/v-ship';
    columns after 'GEMMs' get a 'gemms-' prefix)."""
    sections = []
    for part in line.split("|"):
        toks, cols, prefix, i = part.split(), [], "", 0
        while i < len(toks):
            tok = toks[i]
            if tok == "GEMMs":
                prefix, i = "gemms-", i + 1
                continue
            if tok in ("b/v", "bg/v", "wall", "tuner", "default") and i + 1 < len(toks):
                cols.append(f"{prefix}{tok}-{toks[i + 1]}")
                i += 2
            else:
                cols.append(prefix + tok)
                i += 1
        sections.append(cols)
    sections[0] = sections[0][1:]  # the M column
    return sections


def vk_rows(src: Sources, name: str) -> dict[int, dict[str, float | None]]:
    """M -> the side-by-side columns of a tuner_vllm_kernel table, named by its header (None
    where not timed): def/ship, def/exh, spread, b/v-ship, bg/v-ship, gemms-b/v-ship, ..."""
    sections = _vk_header(search(src, name, r"^\s+M\s+def\s+ship def/ship.*$")[0])
    rows: dict[int, dict[str, float | None]] = {}
    for line in src.text(name).splitlines():
        parts = [p.split() for p in line.split("|")]
        if len(parts) != len(sections) or not parts[0] or not parts[0][0].isdigit():
            continue
        row: dict[str, float | None] = {}
        for cols, cells in zip(sections, [parts[0][1:], *parts[1:]], strict=True):
            if len(cells) == len(cols) and all(re.fullmatch(r"[\d.]+|-", c) for c in cells):
                row.update({c: None if v == "-" else float(v) for c, v in zip(cols, cells)})  # noqa: B905
        rows[int(parts[0][0])] = row
    return rows


def vk_range(src: Sources, names: str, col: str, lo: str = "0", hi: str = "1e9") -> str:
    """A column's range over the runs joined by '+', at the batch sizes lo..hi timed."""
    values = []
    for name in names.split("+"):
        for m, r in vk_rows(src, name).items():
            if float(lo) <= m <= float(hi) and r.get(col) is not None:
                values.append(r[col])
    if not values:
        raise LookupError(f"{names}: no {col} values at M={lo}..{hi}")
    return span(values)


def vk_cell(src: Sources, name: str, col: str, m: str) -> str:
    value = vk_rows(src, name)[int(m)].get(col)
    if value is None:
        raise LookupError(f"{src.path(name)}: no {col} at M={m}")
    return f"{value:.3f}"


def _vk_sizes(src: Sources, names: str, col: str) -> list[int]:
    rows = [vk_rows(src, name) for name in names.split("+")]
    return sorted(m for r in rows for m, v in r.items() if v.get(col) is not None)


def vk_sizes(src: Sources, names: str, col: str = "def/exh") -> str:
    """The batch sizes a column was re-timed at, over the runs joined by '+'."""
    return ", ".join(map(str, _vk_sizes(src, names, col)))


def vk_count(src: Sources, names: str, col: str = "def/exh") -> str:
    return str(len(_vk_sizes(src, names, col)))


def _vk_walls(src: Sources, names: str, label: str) -> tuple[list[float], list[float], str]:
    d, e, ratio = [], [], ""
    for name in names.split("+"):
        m = search(
            src, name, rf"{label} .*?: default ([\d.]+) s / exhaustive ([\d.]+) s = ([\d.]+)"
        )
        d.append(float(m[1]))
        e.append(float(m[2]))
        ratio = m[3]  # the run's own ratio, from its unrounded walls
    return d, e, ratio


def vk_walls(src: Sources, names: str, kind: str) -> str:
    """Default over exhaustive, summed over the runs joined by '+'; kind 'process' (whole tuner
    processes, start-up included) or 'tuning' (the per-M tuning walls)."""
    label = {"process": r"whole tuner processes", "tuning": r"tuning wall at"}[kind]
    d, e, ratio = _vk_walls(src, names, label)
    if len(d) == 1:
        return f"{d[0]:.1f} s / {e[0]:.1f} s = {ratio}"
    parts = " + ".join(f"{x:.1f}" for x in d), " + ".join(f"{x:.1f}" for x in e)
    return f"{parts[0]} = {sum(d):.1f} s / {parts[1]} = {sum(e):.1f} s = {sum(d) / sum(e):.3f}"


def op_times(src: Sources, name: str, m: str, op: str) -> str:
    """vLLM's compiled op against the project's at one M, microseconds ('4.7 vs 9.9')."""
    t = json.loads(src.text(name))["op_times_us"][m][op]
    return f"{t['vllm_us']:.1f} vs {t['project_us']:.1f}"


# ---- kernel and tuner runs on the builtin kernel, replay, load generator --------------------


def kernel_cell(src: Sources, name: str, dtype: str, m: str, col: str) -> str:
    """One cell of a kernel_h200 main table; col: gemms_us, fused_us, ratio, roof, flop."""
    cols = ("gemms_us", "fused_us", "ratio", "roof", "flop")
    pattern = (
        rf"^\| {re.escape(dtype)} \| {int(m)} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|"
        r" ([\d.]+)% \| [\d.]+% \| ([\d.]+)% \|"
    )
    value = search(src, name, pattern)[cols.index(col) + 1]
    return f"{value} %" if col in ("roof", "flop") else value


def tuner_picks(src: Sources, name: str, against: str) -> str:
    """The default pick over exhaustive's ('exh') or the shipped config ('vllm'), side by side."""
    num = r"\s+[\d.]+"
    row = re.compile(
        rf"^\s*(\d+){num}\s+\d+{num} \|{num}{num}\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)"
    )
    found = {}
    for line in src.text(name).splitlines():
        m = row.match(line)
        if m:
            found[int(m[1])] = m[2] if against == "vllm" else m[4]
    values = [float(v) for v in found.values() if v != "-"]
    if not values:
        raise LookupError(f"{src.path(name)}: no side-by-side {against} column")
    return span(values)


def replay_seeds(src: Sources, name: str, m: str) -> str:
    """How many replay seeds reach exhaustive's config at one M ('17 of 20 seeds')."""
    hit = search(src, name, rf"^\s+{int(m)}\s.*\((\d+)/(\d+)\)$")
    return f"{hit[1]} of {hit[2]} seeds"


def _loadgen(src: Sources, name: str) -> dict[int, tuple[float, float]]:
    rows = {}
    for line in src.text(name).splitlines():
        cells = line.split("|")
        if len(cells) == 7 and cells[0].split() and cells[0].split()[0].isdigit():
            errs = [abs(float(c.split()[1])) for c in cells[1:5]]
            rows[int(cells[0].split()[0])] = (max(errs), float(cells[6].split()[1]))
    return rows


def loadgen_err(src: Sources, name: str, conc: str) -> str:
    """The largest mean error of the four metrics at one concurrency."""
    return f"{_loadgen(src, name)[int(conc)][0]:.2f} %"


def loadgen_cores(src: Sources, name: str, conc: str) -> str:
    return f"{_loadgen(src, name)[int(conc)][1]:.2f}"


def telemetry_seconds(src: Sources, name: str) -> str:
    """The load phase's length a telemetry run was asked for (its `settings`)."""
    return f"{json.loads(src.text(name))['settings']['seconds']:g} s"


def snakemake_elapsed(src: Sources, name: str) -> str:
    """A Snakemake run's own 'Elapsed time: H:MM:SS.f' line, as 'M min S s'."""
    m = search(src, name, r"^Elapsed time: (\d+):(\d+):([\d.]+)")
    return minutes(int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]))


def snakemake_jobs(src: Sources, name: str) -> str:
    """The job count of a Snakemake plan's 'Job stats' table."""
    return search(src, name, r"^total\s+(\d+)$")[1]


def nth_spread(src: Sources, name: str, n: str) -> str:
    """The n-th 'median spread of a pair's log-ratio' a report states, rounded to a percent."""
    found = re.findall(r"median spread of a pair's log-ratio ([\d.]+)%", src.text(name))
    if len(found) < int(n):
        raise LookupError(f"{src.path(name)}: fewer than {n} spread statements")
    return f"{float(found[int(n) - 1]):.0f}%"


def passed_in(src: Sources, name: str) -> str:
    """A driver's own 'passed in N s' line."""
    return search(src, name, r"passed in (\d+) s$")[1] + " s"


def assert_below(src: Sources, name: str, var: str) -> str:
    """The bound a test asserts a measured value stays under ('assert stopped_s < 30')."""
    return search(src, name, rf"assert {re.escape(var)} < ([\d.]+)")[1]


# ---- settings the code or the schema holds ---------------------------------------------------


def code_value(src: Sources, name: str, var: str) -> str:
    """A module constant's value (`VAR = 0.05`, `VAR = "2"`)."""
    return search(src, name, rf"^{re.escape(var)} = \"?([\d.]+)\"?")[1]


def confidence(src: Sources, name: str, var: str) -> str:
    """The confidence level a significance constant implies (ALPHA = 0.05 -> 95%)."""
    return f"{(1 - float(code_value(src, name, var))) * 100:g}%"


def schema_default(src: Sources, name: str, key: str) -> str:
    """The `default:` of one property of a YAML schema (the first after `KEY:`)."""
    text = src.text(name)
    at = re.search(rf"^\s+{re.escape(key)}:\s*$", text, re.M)
    if at is None:
        raise LookupError(f"{src.path(name)}: no property {key!r}")
    m = re.compile(r"^\s+default: ([\d.]+)\s*$", re.M).search(text, at.end())
    if m is None:
        raise LookupError(f"{src.path(name)}: {key!r} has no default")
    return f"{float(m[1]):g}"


def sized_changes(src: Sources, name: str) -> str:
    """The two change sizes the report prices in repeats (`for c in (5.0, 1.0)`)."""
    m = search(src, name, r"for c in \(([\d.]+), ([\d.]+)\)")
    return f"{float(m[1]):g} % or {float(m[2]):g} %"


def tuner_seconds(src: Sources, name: str, mode: str, field: str) -> str:
    """One of a tuner mode's summary seconds (wall, cpu, gpu, setup) as the run printed it."""
    line = search(src, name, rf"^\s*{re.escape(mode)}: wall .*$")[0]
    m = re.search(rf"\b{re.escape(field)} ([\d.]+) s", line)
    if m is None:
        raise LookupError(f"{src.path(name)}: {mode}'s summary has no {field}")
    return f"{m[1]} s"


def tuner_pick_at(src: Sources, name: str, against: str, m: str) -> str:
    """The default pick over exhaustive's ('exh') or the shipped config ('vllm') at one M."""
    num = r"\s+[\d.]+"
    row = re.compile(
        rf"^\s*{int(m)}{num}\s+\d+{num} \|{num}{num}\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)"
    )
    value = None
    for line in src.text(name).splitlines():
        hit = row.match(line)
        if hit:
            value = hit[1] if against == "vllm" else hit[3]
    if value in (None, "-"):
        raise LookupError(f"{src.path(name)}: no side-by-side {against} value at M={m}")
    return value


def compile_ready(src: Sources, name: str, kind: str) -> str:
    """The median time until the last compile worker is ready, for one kind of worker."""
    line = search(src, name, r"^median last_ready: (.*)$")[1]
    m = re.search(rf"{re.escape(kind.replace('_', ' '))} ([\d.]+) s", line)
    if m is None:
        raise LookupError(f"{src.path(name)}: no median for {kind!r}")
    return f"{m[1]} s"


def tune_wall(src: Sources, name: str) -> str:
    """A tuner summary's wall seconds (`seconds.wall` of tune_summary.json)."""
    return f"{json.loads(src.text(name))['seconds']['wall']:.1f} s"


def pytest_failed(src: Sources, name: str) -> str:
    """How many tests a pytest run's summary says failed."""
    m = re.match(r"(\d+) failed", pytest_counts(src, name))
    if m is None:
        raise LookupError(f"{src.path(name)}: the summary names no failure")
    return m[1]


def device_line(src: Sources, name: str) -> str:
    """The device name on the first line that names a card (a 'name, driver' CSV row)."""
    for line in src.text(name).splitlines():
        if CARD.search(line):
            return line.split(",")[0].strip()
    raise LookupError(f"{src.path(name)}: no line names the card")


# ---- pipeline runs on a lent GPU (report.md, the run's tarball) -----------------------------


def report_cv(src: Sources, name: str) -> str:
    """The median spread of one repeat a report states ('median CV 16.80% of a repeat')."""
    cv = float(search(src, name, r"median CV ([\d.]+)% of a repeat")[1])
    return f"{cv:.1f} %"


def report_repeats(src: Sources, name: str) -> str:
    """How many repeats a side the report says a 5% change needs."""
    return search(src, name, r"a 5% change needs (\d+) repeats a side")[1]


def _energy(src: Sources, name: str) -> dict[str, tuple[float, float]]:
    rows = re.findall(r"^\| Triton MoE (Tuned|Untuned)\s*\| ([\d.]+)\s*\| ([\d.]+)\s*\|$",
                      src.text(name), re.M)  # fmt: skip
    if not rows:
        raise LookupError(f"{src.path(name)}: no per-arm energy table")
    return {arm.lower(): (float(j), float(w)) for arm, j, w in rows}


def energy(src: Sources, name: str, arm: str) -> str:
    j, w = _energy(src, name)[arm]
    return f"{j:.4f} J/token at {w:.1f} W"


def energy_change(src: Sources, name: str) -> str:
    e = _energy(src, name)
    return f"{(e['tuned'][0] / e['untuned'][0] - 1) * 100:+.1f} %"


def tune_gains(src: Sources, name: str) -> str:
    """Each entry's gain over the baseline, in batch-size order, from a tune summary."""
    entries = json.loads(src.text(name))["entries"]
    return ", ".join(f"{e['improvement_pct']:.1f}" for _, e in sorted(entries.items(),
                     key=lambda kv: int(kv[0])))  # fmt: skip


def tune_improved(src: Sources, name: str, floor: str) -> str:
    """How many entries gain more than `floor` percent ('11 of 12')."""
    entries = json.loads(src.text(name))["entries"].values()
    better = sum(e["improvement_pct"] >= float(floor) for e in entries)
    return f"{better} of {len(entries)}"


def steps_done(src: Sources, name: str) -> str:
    """The job count of a finished Snakemake run ('12 of 12 steps (100%) done')."""
    return search(src, name, r"^(\d+) of \1 steps \(100%\) done")[1]


def gsm8k_score(src: Sources, name: str) -> str:
    """Questions right out of the questions asked, from a GSM8K result file."""
    d = json.loads(src.text(name))
    return f"{round(d['strict_match'] * d['n_samples'])} of {d['n_samples']}"


FAMILIES = {
    "vk-range": vk_range,
    "vk-cell": vk_cell,
    "vk-sizes": vk_sizes,
    "vk-count": vk_count,
    "vk-walls": vk_walls,
    "op-times": op_times,
    "kernel-cell": kernel_cell,
    "tuner-picks": tuner_picks,
    "replay-seeds": replay_seeds,
    "loadgen-err": loadgen_err,
    "loadgen-cores": loadgen_cores,
    "telemetry-seconds": telemetry_seconds,
    "snakemake-elapsed": snakemake_elapsed,
    "snakemake-jobs": snakemake_jobs,
    "nth-spread": nth_spread,
    "passed-in": passed_in,
    "assert-below": assert_below,
    "code": code_value,
    "confidence": confidence,
    "schema-default": schema_default,
    "sized-changes": sized_changes,
    "tuner-seconds": tuner_seconds,
    "tuner-pick-at": tuner_pick_at,
    "compile-ready": compile_ready,
    "tune-wall": tune_wall,
    "pytest-failed": pytest_failed,
    "device-line": device_line,
    "report-cv": report_cv,
    "report-repeats": report_repeats,
    "energy": energy,
    "energy-change": energy_change,
    "tune-gains": tune_gains,
    "tune-improved": tune_improved,
    "steps-done": steps_done,
    "gsm8k-score": gsm8k_score,
}
