"""How each published figure is computed from its result file (render_figures.py's families).

A family is a function `(Sources, *args) -> str`; a page names it as `family:arg:arg...`. Paths
in names are relative to benchmarks/results/ unless they start with one of TOP (workflow/,
tests/, .ci/, benchmarks/); `ARCHIVE.tar.gz!MEMBER` names one member of a committed tarball.
Every file is read through `Sources`, which keeps the list of what was read and raises
FileNotFoundError for a file missing from the working tree (git history is never read).
figure_runs.py and figure_tables.py hold the other families.
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
        if "!" in rel:  # ARCHIVE.tar.gz!MEMBER, one member of a committed tarball
            rel, member = rel.split("!", 1)
        return self._decode(rel, member)

    def member(self, archive: str, member: str) -> str:
        """One member of a committed tarball."""
        return self._decode(self.path(archive), member)

    def _decode(self, rel: str, member: str | None) -> str:
        file = self.root / rel
        if not file.is_file():
            raise FileNotFoundError(2, "missing", rel)
        shown = rel if member is None else f"{rel}!{member}"
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
        raise LookupError(f"{archive}!{member}: no data row")
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


def grep_int(src: Sources, name: str, key: str) -> str:
    """A `KEY=VALUE` or `KEY: VALUE` setting in a config or script file."""
    return search(src, name, rf"\b{re.escape(key)}\s*[=:]\s*\"?([\d.]+)")[1]


FAMILIES = {
    "card": card,
    "device": device,
    "vllm-ops": vllm_ops,
    "bvv-range": bvv_range,
    "bvv-le1": bvv_le1,
    "bvv-count": bvv_count,
    "bvv-slower": bvv_slower,
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
    "setting": grep_int,
}
