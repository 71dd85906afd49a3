"""Render every published figure from the result file it comes from.

A page (README.md, docs/*.md, benchmarks/**/*.md) holds each figure between markers:

    <!-- fig NAME -->VALUE<!-- /fig -->           a figure inside a sentence
    <!-- table NAME -->                           a table, on lines of its own
    ...
    <!-- /table -->

NAME is `family:arg:arg...`; `figure_sources.py` computes each family from files in the working
tree (a figure whose file is missing is an error: nothing is read back from git history). This
script writes every VALUE; `--check` renders again and fails on any difference, on an unknown
name, on a missing source, and on a figure left in the prose outside the markers (a number with
a unit, a decimal ratio, "N of M", a test count or a card name), where no file would keep it
true. Pages a program writes whole are not scanned: GENERATED.

    python3 benchmarks/render_figures.py            # write every page
    python3 benchmarks/render_figures.py --check    # exit 1 on any difference or problem
    python3 benchmarks/render_figures.py --list     # each figure, its value and its files
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "workflow"))
import figure_any_list  # noqa: E402
import figure_runs  # noqa: E402
import figure_sources  # noqa: E402
import figure_tables  # noqa: E402
from cellbench.common import atomicio  # noqa: E402

ROOT = HERE.parent
FAMILIES = {
    **figure_sources.FAMILIES,
    **figure_runs.FAMILIES,
    **figure_any_list.FAMILIES,
    **figure_tables.TABLES,
}

# A marker quoted in inline code (`<!-- fig ... -->`) is documentation, not a figure.
FIG = re.compile(r"(?<!`)<!-- fig (?P<name>[^ ]+) -->(?P<body>.*?)<!-- /fig -->", re.S)
TABLE = re.compile(
    r"(?P<open>(?<!`)<!-- table (?P<name>[^ ]+) -->\n)(?P<body>.*?)(?=<!-- /table -->)", re.S
)

# Pages a program writes whole: the page is the output, its figures are the source.
GENERATED = (
    re.compile(r"docs/bad-input\.md"),  # rendered from tests/support's probe tables
    re.compile(r"benchmarks/results/.*/report\.md"),  # the pipeline's report of that run
    re.compile(r"benchmarks/results/[a-z_]+(?:_\d{4}-\d{2}-\d{2})?\.md"),  # a script's table
)

# A figure in prose: what the check refuses outside the markers.
UNIT = r"(?:s|min|ms|us|µs|%|GB|GiB|MB|MiB|TB/s|GB/s|TFLOP/s|h|minutes?|seconds?|hours?|x)"
NUM = r"\d+(?:\.\d+)?"
PROSE_FIGURE = re.compile(
    rf"(?<![\w.\-/]){NUM}(?:\s?-\s?{NUM})?\s?{UNIT}(?![\w/\-])"
    r"|(?<![\w.\-/])\d+\.\d{2,}(?![\w.])"  # a ratio such as 0.986
    r"|(?<![\w.])\d+ of (?:the )?\d+\b"  # a count such as 8 of 18
    r"|(?<![\w.])\d+ (?:passed|failed|skipped|errors?|xfailed)\b"
    r"|(?<![\w.\-/])\d+ (?:jobs|failures|tests)\b"  # a count of what a run did
    r"|\b(?:H100|H200|A100|MI\d{3}X?)\b"  # a card
)
# Stretches where digits are not figures: code, link targets, markers' own names, and software
# versions (a package's name or a comparison before them).
SOFTWARE = (
    r"Python|python|torch|Triton|triton|transformers|Snakemake|snakemake|vLLM|vllm|Slurm|CUDA"
    r"|pydantic|pyenv|datasets|pyarrow|huggingface_hub`?|tokenizers`?|safetensors`?"
)
NOT_PROSE = re.compile(
    r"```.*?```|`[^`\n]*`|\]\([^)]*\)|<!--.*?-->"
    rf"|\b(?:{SOFTWARE})\s+\d+(?:\.\d+)+|(?:>=|<=|==|<|>)\s*\d+(?:\.\d+)*",
    re.S | re.M,
)
# Inside inline code a figure still counts when the span holds nothing else (`41 min`, `H200`);
# a bare number there (a version, a setting) does not.
CODE_FIGURE = re.compile(
    rf"`(?:{NUM}(?:\s?-\s?{NUM})?\s?{UNIT}|\d+ of \d+|H100|H200|A100|MI\d{{3}}X?)`"
)


class SourceMissing(Exception):
    """A figure's result file is not in the working tree."""


def pages(root: Path) -> list[str]:
    found = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    found += sorted((root / "benchmarks").rglob("*.md"))
    return [p.relative_to(root).as_posix() for p in found if p.is_file()]


def generated(page: str) -> bool:
    return any(p.fullmatch(page) for p in GENERATED)


def compute(name: str, root: Path) -> tuple[str, list[str]]:
    """The figure's text and the files it was computed from."""
    family, *args = name.split(":")
    fn = FAMILIES.get(family)
    if fn is None:
        raise KeyError(f"unknown figure family {family!r} (known: {sorted(FAMILIES)})")
    src = figure_sources.Sources(root)
    try:
        value = fn(src, *args)
    except FileNotFoundError as exc:
        raise SourceMissing(f"source {exc.filename} missing from the working tree") from None
    return str(value), src.read


def render(page: str, text: str, root: Path, problems: list[str]) -> str:
    """The page with every marker's value computed afresh; problems collects what failed."""

    def one(m: re.Match, table: bool) -> str:
        name = m["name"]
        try:
            value, _ = compute(name, root)
        except (SourceMissing, LookupError, ValueError, TypeError) as exc:
            problems.append(f"{page}: {name}: {exc}")
            return m.group(0)
        if table:
            return m["open"] + value.rstrip("\n") + "\n"
        return f"<!-- fig {name} -->{value}<!-- /fig -->"

    text = TABLE.sub(lambda m: one(m, True), text)
    return FIG.sub(lambda m: one(m, False), text)


def _blank(m: re.Match) -> str:
    return m.group(0) if CODE_FIGURE.fullmatch(m.group(0)) else " " * len(m.group(0))


def _without_code_blocks(text: str) -> str:
    """The text with indented code blocks blanked: lines indented by four spaces or a tab
    that follow a blank line or another such line (a list's continuation lines stay prose)."""
    out, in_block, prev_blank = [], False, True
    for line in text.split("\n"):
        indented = line.startswith(("    ", "\t")) and line.strip()
        listed = re.match(r"\s*(?:[-*+]|\d+\.)\s", line)
        in_block = bool(indented and not listed and (prev_blank or in_block))
        out.append(" " * len(line) if in_block else line)
        prev_blank = not line.strip()
        in_block = in_block or (in_block and prev_blank)
    return "\n".join(out)


def prose_figures(text: str) -> list[str]:
    """Figures outside markers, code and links: each with a little of its sentence."""
    prose = NOT_PROSE.sub(_blank, _without_code_blocks(_strip_tables(text)))
    flat = " ".join(prose.split())
    return [
        f"{m.group(0)!r} in ...{flat[max(0, m.start() - 40) : m.end() + 30]}..."
        for m in PROSE_FIGURE.finditer(flat)
    ]


def _strip_tables(text: str) -> str:
    text = TABLE.sub(lambda m: m["open"], text)
    return FIG.sub(lambda m: f"<!-- fig {m['name']} --><!-- /fig -->", text)


def check(root: Path | None = None) -> list[str]:
    """Every problem, one line each; an empty list means every page is as its files say."""
    root = root or ROOT
    problems: list[str] = []
    for page in pages(root):
        if generated(page):
            continue
        text = (root / page).read_text(encoding="utf-8")
        before = len(problems)
        rendered = render(page, text, root, problems)
        if len(problems) == before and rendered != text:
            problems += _differences(page, text, rendered)
        problems += [f"{page}: figure outside the markers: {f}" for f in prose_figures(text)]
    return problems


def _differences(page: str, text: str, rendered: str) -> list[str]:
    old = {m["name"]: m["body"] for m in (*FIG.finditer(text), *TABLE.finditer(text))}
    new = {m["name"]: m["body"] for m in (*FIG.finditer(rendered), *TABLE.finditer(rendered))}
    diff = [n for n in new if old.get(n) != new[n]]
    return [f"{page}: {n} reads {old.get(n)!r}, its files give {new[n]!r}" for n in diff]


def write(root: Path | None = None) -> list[str]:
    """Render every page in place; returns the problems (a page whose figures cannot all be
    computed is left as it was; a figure in prose is reported, not changed)."""
    root = root or ROOT
    problems: list[str] = []
    for page in pages(root):
        if generated(page):
            continue
        path = root / page
        text = path.read_text(encoding="utf-8")
        before = len(problems)
        rendered = render(page, text, root, problems)
        if len(problems) == before and rendered != text:
            atomicio.write_text(path, rendered)
        problems += [f"{page}: figure outside the markers: {f}" for f in prose_figures(text)]
    return problems


def listing(root: Path) -> list[str]:
    rows = ["| page | figure | value | files |", "| --- | --- | --- | --- |"]
    for page in pages(root):
        text = (root / page).read_text(encoding="utf-8")
        for m in (*FIG.finditer(text), *TABLE.finditer(text)):
            try:
                value, read = compute(m["name"], root)
            except (SourceMissing, LookupError, ValueError, TypeError) as exc:
                value, read = f"ERROR {exc}", []
            shown = value if "\n" not in value else f"({value.count(chr(10))} lines)"
            rows.append(f"| {page} | {m['name']} | {shown} | {', '.join(read)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 on any difference or problem")
    mode.add_argument("--list", action="store_true", help="print each figure and its files")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(listing(ROOT)))
        return 0
    problems = check() if args.check else write()
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
