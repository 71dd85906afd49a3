"""How each published figure is computed from its result file (render_figures.py's families).

A family is a function `(Sources, *args) -> str`; a page names it as `family:arg:arg...`. Paths
in names are relative to benchmarks/results/ unless they start with a top-level folder of the
repository (workflow/, tests/, .ci/). Every file is read through `Sources`, which keeps the list
of what was read and raises FileNotFoundError for a file missing from the working tree.
"""

from __future__ import annotations

import gzip
import re
import tarfile
from pathlib import Path

TOP = ("workflow/", "tests/", ".ci/", "benchmarks/")


class Sources:
    """Files of one working tree, read only from that tree."""

    def __init__(self, root: Path):
        self.root = root
        self.read: list[str] = []

    def path(self, name: str) -> str:
        return name if name.startswith(TOP) else f"benchmarks/results/{name}"

    def text(self, name: str) -> str:
        rel = self.path(name)
        member = None
        if "::" in rel:  # ARCHIVE.tar.gz::MEMBER, one member of a committed tarball
            rel, member = rel.split("::", 1)
        return self._decode(rel, member)

    def member(self, archive: str, member: str) -> str:
        """One member of a committed tarball."""
        return self._decode(self.path(archive), member)

    def _decode(self, rel: str, member: str | None) -> str:
        file = self.root / rel
        if not file.is_file():
            raise FileNotFoundError(2, "missing", rel)
        shown = rel if member is None else f"{rel}::{member}"
        if shown not in self.read:
            self.read.append(shown)
        if member is not None:
            with tarfile.open(file) as tar:
                data = tar.extractfile(member).read()
        else:
            data = file.read_bytes()
            if rel.endswith(".gz"):
                data = gzip.decompress(data)
        return data.decode(errors="replace")


def search(src: Sources, name: str, pattern: str, flags: int = re.M) -> re.Match:
    # the last match: a file that prints a summary twice means its final one
    m = next(iter(reversed(list(re.finditer(pattern, src.text(name), flags)))), None)
    if m is None:
        raise LookupError(f"{src.path(name)} holds no line matching {pattern!r}")
    return m


# ---- cards and software --------------------------------------------------------------------

CARD = re.compile(r"(?<![A-Za-z0-9])(H100|H200|A100|MI\d{3}X?)(?![A-Za-z0-9])")


def card(src: Sources, name: str) -> str:
    """The card's short name from the first line of a run's file that names its device
    ('device: NVIDIA H100 80GB HBM3', '"gpu_name": "NVIDIA H200"', 'name, ...' CSV rows)."""
    about = re.compile(r"device|card|gpu|machine|^name|^NVIDIA|^AMD", re.I)
    for line in src.text(name).splitlines():
        m = CARD.search(line)
        if m and about.search(line):
            return m[1]
    raise LookupError(f"{src.path(name)}: no line names the card")


def device(src: Sources, name: str) -> str:
    """The full device name as the run printed it."""
    return search(src, name, r"^device: (.+)$")[1].strip()


def vllm_ops(src: Sources, name: str) -> str:
    """Which ops a builtin-vs-vLLM run's vLLM side ran: its own compiled ones or the project's."""
    text = src.text(name)
    compiled = re.findall(r"^(?:vllm column|vLLM call's):? ?(\w+): vLLM [\d.]+ _", text, re.M)
    wanted = {"moe_align_block_size", "silu_and_mul", "activation_quant", "moe_sum"}
    if wanted <= set(compiled):
        return "vLLM's own compiled align, SiLU-and-mul, quantisation and sum"
    if not compiled:
        return "the project's own align, SiLU-and-mul, quantisation and sum"
    raise LookupError(f"{src.path(name)}: vLLM side mixes ops: {sorted(compiled)}")


# ---- builtin kernel against vLLM's (builtin_vs_vllm_*.txt) ---------------------------------


def bvv_columns(src: Sources, name: str) -> dict[int, dict[str, float | None]]:
    """M -> {'vllm_us', 'whole.COL', 'gemms.COL', 'spread'} for every variant column a
    builtin-vs-vLLM table printed (the builtin over vLLM; None where the variant was not run)."""
    text = src.text(name)
    header = search(src, name, r"^whole call: (.+?) \| GEMMs alone: same$")[1]
    cols = [c.strip() for c in header.split(",")]
    rows: dict[int, dict[str, float | None]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        head = parts[0].split()
        if len(parts) < 4 or len(head) != 2 or not head[0].isdigit():
            continue
        whole, gemms = parts[1].split(), parts[2].split()
        if len(whole) != len(cols) or len(gemms) != len(cols):
            continue
        row: dict[str, float | None] = {"vllm_us": float(head[1]), "spread": float(parts[3])}
        for part, cells in (("whole", whole), ("gemms", gemms)):
            for col, cell in zip(cols, cells, strict=True):
                row[f"{part}.{col}"] = None if cell == "-" else float(cell)
        rows[int(head[0])] = row
    if not rows:
        raise LookupError(f"{src.path(name)}: no builtin/vLLM table rows")
    return rows


def bvv_rows(src: Sources, name: str) -> dict[int, dict[str, float]]:
    """M -> {'vllm_us', 'new', 'gemms', 'spread'}: the default (column `new`) over vLLM."""
    return {
        m: {"vllm_us": r["vllm_us"], "new": r["whole.new"], "gemms": r["gemms.new"],
            "spread": r["spread"]}
        for m, r in bvv_columns(src, name).items()
    }  # fmt: skip


def bvv_cell(src: Sources, name: str, col: str, m: str) -> str:
    """One variant's ratio at one M; col is 'whole.COL' or 'gemms.COL'."""
    value = bvv_columns(src, name)[int(m)][col]
    if value is None:
        raise LookupError(f"{src.path(name)}: {col} was not run at M={m}")
    return f"{value:.3f}"


def bvv_col_range(src: Sources, name: str, col: str, lo: str = "0", hi: str = "1e9") -> str:
    """A variant's range over the batch sizes lo..hi where it was run."""
    rows = bvv_columns(src, name).items()
    values = [r[col] for m, r in rows if float(lo) <= m <= float(hi) and r[col] is not None]
    if not values:
        raise LookupError(f"{src.path(name)}: {col} has no value at M={lo}..{hi}")
    return span(values)


def total_wall(src: Sources, name: str) -> str:
    """A script's own 'total wall N s' line."""
    return search(src, name, r"^total wall ([\d.]+) s")[1] + " s"


def span(values, fmt: str = "{:.3f}") -> str:
    values = list(values)
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def bvv_range(src: Sources, name: str, col: str = "new") -> str:
    return span(r[col] for r in bvv_rows(src, name).values())


def bvv_le1(src: Sources, name: str) -> str:
    """How many batch sizes the builtin's whole call is at or below vLLM's (ratio <= 1)."""
    return str(sum(r["new"] <= 1.0 for r in bvv_rows(src, name).values()))


def bvv_count(src: Sources, name: str) -> str:
    return str(len(bvv_rows(src, name)))


def bvv_slower(src: Sources, name: str) -> str:
    """The batch sizes where the builtin is slower (ratio above 1)."""
    return ", ".join(str(m) for m, r in bvv_rows(src, name).items() if r["new"] > 1.0)


def bvv_at(src: Sources, name: str, m: str, col: str = "new") -> str:
    return f"{bvv_rows(src, name)[int(m)][col]:.3f}"


def bvv_worst(src: Sources, name: str) -> str:
    m, r = max(bvv_rows(src, name).items(), key=lambda kv: kv[1]["new"])
    return f"{r['new']:.3f} at M={m}"


# ---- timing files ---------------------------------------------------------------------------


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s"


def embedded_wall(src: Sources, name: str) -> str:
    """`snakemake all`'s elapsed time in an embedded_default_time_*.txt, as 'M min S s'."""
    m = search(
        src, name, r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)"
    )
    return minutes(int(m[1] or 0) * 3600 + int(m[2]) * 60 + float(m[3]))


def embedded_commit(src: Sources, name: str) -> str:
    return search(src, name, r"^# commit ([0-9a-f]{7})")[1]


def embedded_cores(src: Sources, name: str) -> str:
    return search(src, name, r"^# (\d+) cores")[1]


def pytest_summary(src: Sources, name: str) -> str:
    """A pytest run's last summary line without its '=' rule ('3 passed in 9.1s (0:00:09)')."""
    m = search(src, name, r"^(?:=+ )?((?:\d+ \w+, )*\d+ \w+ in [\d.]+s(?: \([\d:]+\))?)(?: =+)?$")
    return m[1]


def pytest_counts(src: Sources, name: str) -> str:
    """The summary's counts only ('1 failed, 249 passed, 12 skipped')."""
    return pytest_summary(src, name).split(" in ")[0]


def slurm_wall(src: Sources, name: str, what: str, unit: str = "s") -> str:
    """A wall the Slurm test printed: `what` is 'default' or 'scancel'; unit 's' or 'min'."""
    label = {"default": r"embedded default through Slurm", "scancel": r"scancel \+ rerun"}[what]
    seconds = search(src, name, rf"\[test_slurm\] {label}: (\d+) s")[1]
    return minutes(int(seconds)) if unit == "min" else f"{seconds} s"


def _tsv_seconds(src: Sources, archive: str, member: str) -> float:
    """The wall seconds of a Snakemake benchmark file inside a run's tarball."""
    m = re.search(r"^([\d.]+)\t", src.member(archive, member), re.M)
    if m is None:
        raise LookupError(f"{archive}::{member}: no data row")
    return float(m[1])


def tar_tsv(src: Sources, archive: str, member: str) -> str:
    return f"{_tsv_seconds(src, archive, member):.2f} s"


def cell_cost(src: Sources, archive: str, cell: str) -> str:
    """GPU-seconds of one cell per unit of TP: the tune holds tp GPUs, the serve pair 2 x tp."""
    tune = _tsv_seconds(src, archive, f"{cell}/tune.tsv")
    pair = _tsv_seconds(src, archive, f"{cell}/serve-pair.tsv")
    return f"{tune:.2f} s x tp + {pair:.2f} s x 2 tp = {tune + 2 * pair:.2f} GPU-seconds x tp"


def cells_per_hour(src: Sources, archive: str, cell: str, gpus: str, tp: str) -> str:
    tune = _tsv_seconds(src, archive, f"{cell}/tune.tsv")
    pair = _tsv_seconds(src, archive, f"{cell}/serve-pair.tsv")
    return f"{int(gpus) * 3600 / ((tune + 2 * pair) * int(tp)):.3g}"


def tuner_walls(src: Sources, name: str) -> str:
    """'default D s / exhaustive E s = R' from a tuner run's summary lines."""
    d = float(search(src, name, r"^\s*default: wall ([\d.]+) s")[1])
    e = float(search(src, name, r"^exhaustive: wall ([\d.]+) s")[1])
    return f"{d:.1f} s / {e:.1f} s = {d / e:.3f}"


def vllm_kernel_process(src: Sources, name: str) -> str:
    """Whole tuner processes, default over exhaustive, as a tuner_vllm_kernel run printed them."""
    m = search(src, name, r"whole tuner processes .*?: default ([\d.]+) s / exhaustive ([\d.]+) s")
    return f"{m[1]} s / {m[2]} s = {float(m[1]) / float(m[2]):.3f}"


def vllm_kernel_tuning(src: Sources, name: str) -> str:
    m = search(src, name, r"tuning wall at M=[\d,]+: default ([\d.]+) s / exhaustive ([\d.]+) s")
    return f"{m[1]} s / {m[2]} s = {float(m[1]) / float(m[2]):.3f}"


def grep_int(src: Sources, name: str, key: str) -> str:
    """A `KEY=VALUE` or `KEY: VALUE` setting in a config or script file."""
    return search(src, name, rf"\b{re.escape(key)}\s*[=:]\s*\"?([\d.]+)")[1]


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
    import json

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
    import json

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
    import json

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


FAMILIES = {
    "card": card,
    "device": device,
    "vllm-ops": vllm_ops,
    "bvv-range": bvv_range,
    "bvv-le1": bvv_le1,
    "bvv-count": bvv_count,
    "bvv-slower": bvv_slower,
    "bvv-at": bvv_at,
    "bvv-cell": bvv_cell,
    "bvv-col-range": bvv_col_range,
    "total-wall": total_wall,
    "bvv-worst": bvv_worst,
    "embedded-wall": embedded_wall,
    "embedded-commit": embedded_commit,
    "embedded-cores": embedded_cores,
    "pytest": pytest_summary,
    "pytest-counts": pytest_counts,
    "slurm-wall": slurm_wall,
    "tar-tsv": tar_tsv,
    "cell-cost": cell_cost,
    "cells-per-hour": cells_per_hour,
    "tuner-walls": tuner_walls,
    "vllm-kernel-process": vllm_kernel_process,
    "vllm-kernel-tuning": vllm_kernel_tuning,
    "setting": grep_int,
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
}
