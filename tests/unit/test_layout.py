"""The package's layout as docs/design.md draws it.

Read from the source with ``ast`` (nothing is imported): no import cycle, between stage folders
or between modules; no import pointing up the layer order; the report side's own order (frames
at the bottom); the in-container folders import only what the vLLM image has; docs/design.md's
Layout section lists exactly the modules and rules files that exist; no source file over
650 lines.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workflow" / "cellbench"
RULES = ROOT / "workflow" / "rules"
DESIGN = ROOT / "docs" / "design.md"

# Bottom first: a module imports its own folder and the folders before it here, never one after.
# docs/design.md states the same order (checked below). `cli` and `joblog` are the package
# root's modules; the root itself (`cellbench`, its version only) is below everything.
LAYERS = (
    "common",
    "stats",
    "contracts",
    "tune",
    "runtime",
    "assets",
    "gsm8k",
    "serve",
    "results",
    "gates",
    "report",
    "archive",
    "configs",
    "config",
    "watch",
    "cli",
    "joblog",
)
# Inside report/, bottom first: the frames every renderer reads, then the renderers, then the
# job that writes report.md. A module imports only the groups before its own.
REPORT_LAYERS = (
    ("frames", "comparison_tables"),
    ("tidy", "sections", "percentile_claims"),
    ("plots", "previous", "priors"),
    ("capacity",),
    ("pr_markdown",),
    ("build",),
)
# The tune stage runs inside the vLLM image: the standard library, torch, triton and vllm (and
# huggingface_hub, which every vLLM image carries, for a model config by name) only.
IN_CONTAINER = ("tune", "common")
IN_CONTAINER_ALLOWED = set(sys.stdlib_module_names) | {
    "__future__",
    "torch",
    "triton",
    "vllm",
    "huggingface_hub",
}
MAX_LINES = 650


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every absolute module an import statement in ``path`` names (lazy ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; write cellbench.X"
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _resolve(name: str) -> str | None:
    """The cellbench module ``name`` lands in (``from cellbench.x import f`` -> cellbench.x)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for name in _imports(path):
            if name.split(".")[0] != "cellbench":
                continue
            target = _resolve(name)
            if target and target != module:
                edges[module].add(target)
    return edges


EDGES = _edges()


def _folder(module: str) -> str | None:
    """The stage folder (or root module) a cellbench module belongs to; None for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def test_every_folder_and_root_module_has_a_layer():
    folders = {_folder(m) for m in MODULES} - {None}
    assert folders - set(LAYERS) == set(), "a new folder needs its place in LAYERS and design.md"


def test_no_import_cycle_between_stage_folders():
    folder_edges: dict[str, set[str]] = defaultdict(set)
    for src, targets in EDGES.items():
        for dst in targets:
            a, b = _folder(src), _folder(dst)
            if a and b and a != b:
                folder_edges[a].add(b)
    assert _cycles(folder_edges) == []


def test_no_import_cycle_between_modules():
    assert _cycles(EDGES) == []


def test_no_import_points_up_the_layers():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = sorted(
        f"{src} -> {dst}"
        for src, targets in EDGES.items()
        for dst in targets
        if _folder(src) and _folder(dst) and rank[_folder(dst)] > rank[_folder(src)]
    )
    assert upward == []


def test_the_report_side_flows_one_way():
    rank = {name: i for i, group in enumerate(REPORT_LAYERS) for name in group}
    listed = {m.rpartition(".")[2] for m in MODULES if m.startswith("cellbench.report.")}
    assert listed - {"__main__"} == set(rank), "a new report module needs its place"
    wrong = sorted(
        f"{src} -> {dst}"
        for src, targets in EDGES.items()
        if src.startswith("cellbench.report.") and not src.endswith("__main__")
        for dst in targets
        if dst.startswith("cellbench.report.")
        and rank[dst.rpartition(".")[2]] >= rank[src.rpartition(".")[2]]
    )
    assert wrong == []


def test_in_container_folders_import_only_what_the_image_has():
    offenders = {}
    for module, path in MODULES.items():
        if _folder(module) not in IN_CONTAINER:
            continue
        bad = set()
        for name in _imports(path):
            top = name.split(".")[0]
            if top == "cellbench":
                target = _resolve(name)
                if target != "cellbench" and _folder(target) not in IN_CONTAINER:
                    bad.add(name)
            elif top not in IN_CONTAINER_ALLOWED:
                bad.add(name)
        if bad:
            offenders[module] = sorted(bad)
    assert offenders == {}


def _layout_section() -> str:
    text = DESIGN.read_text()
    start = text.index("## Layout")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _layout_listing() -> dict[str, set[str]]:
    """The Layout section's fenced listing: folder (relative to the repository) -> the file
    names listed on its line (``NAME.py``, ``NAME.smk``)."""
    section = _layout_section()
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block, "docs/design.md's Layout section needs its fenced listing of the tree"
    listing: dict[str, set[str]] = {}
    parent = folder = ""
    for line in block.group(1).splitlines():
        m = re.match(r"^(\s*)(\S+/)(\s.*)?$", line)
        if m:  # a folder's line: top-level, or indented under the last top-level one
            folder = m.group(2) if not m.group(1) else parent + m.group(2)
            if not m.group(1):
                parent = m.group(2)
            listing[folder] = set()
            rest = m.group(3) or ""
        elif line.startswith(" ") and folder:  # its names continued
            rest = line
        else:
            folder, rest = "", ""
        if folder:
            listing[folder] |= set(re.findall(r"[\w.]+\.(?:py|smk)\b", rest))
    return listing


def test_design_md_lists_every_module_and_rules_file():
    listing = _layout_listing()
    want: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py" or (path.name == "__init__.py" and path.parent != PACKAGE):
            continue
        want[path.parent.relative_to(ROOT).as_posix() + "/"].add(path.name)
    want["workflow/rules/"] = {p.name for p in RULES.glob("*.smk")}
    got = {folder: names for folder, names in listing.items() if folder in want or names}
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


def test_design_md_states_the_layer_order_the_tests_check():
    line = next(
        (line for line in _layout_section().splitlines() if line.startswith("Layers, bottom")),
        None,
    )
    assert line, "docs/design.md's Layout section needs its 'Layers, bottom first:' line"
    assert tuple(re.findall(r"`(\w+)`", line)) == LAYERS


def _source_files() -> list[Path]:
    files = [p for p in (ROOT / "workflow").rglob("*.py")]
    files += [p for p in (ROOT / "benchmarks").rglob("*.py")]
    files += [p for p in (ROOT / "tests").rglob("*.py")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def _over_limit() -> dict[str, int]:
    out = {}
    for path in _source_files():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            out[path.relative_to(ROOT).as_posix()] = n
    return out


def test_no_source_file_over_650_lines():
    """Every Python file of the package, benchmarks/ and tests/ under the limit."""
    assert _over_limit() == {}


TESTS = ROOT / "tests"
TEST_FOLDERS = ("unit", "stage", "workflow", "integration")


def test_tests_live_in_their_folders_and_import_no_other_test_module():
    """Every test module sits in one of the folders (by speed and scope), and
    shares code only through tests/support/, never by importing another test module."""
    assert not list(TESTS.glob("test_*.py")), "test modules belong in " + ", ".join(TEST_FOLDERS)
    modules = sorted(TESTS.glob("*/test_*.py"))
    assert modules and {p.parent.name for p in modules} == set(TEST_FOLDERS)
    offenders = []
    for path in modules + sorted((TESTS / "support").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[-1].startswith("test_")]  # fmt: skip
    assert offenders == []
