"""Where the stages meet, read from the source with ``ast`` (plus one real import): the report
and the results loaders see the contracts, never the serve stage; the config layer reaches only
the contracts and ``common`` (the edges still left are listed by name and may only shrink); the
report imports without the optional Prometheus and NVML packages; no private name crosses a
module in the folders checked here; no function there runs past a screen; no issue number in
file names or in the text of the workflow, the docs, the configs and the benchmark scripts.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workflow" / "cellbench"

# The folders these checks cover. config/cost.py is another change's (the SLA capacity
# search) and joins when that lands; the other stage folders are checked as they are cleaned.
CHECKED = ("contracts", "report", "results", "stats", "watch", "config")
NOT_YET = {"config/cost.py"}
MAX_FUNCTION_LINES = 80

# What config/ still imports beyond the contracts, common and stats: the model's shapes (tune,
# in the image, so they cannot move below it), the tiny model's recipe (assets), the server
# command (serve.server), the images command (runtime), the gathered configs' image facts
# (configs) and the archive's read side (results). The list may only shrink.
CONFIG_PENDING = {
    ("cellbench.config.detect_plan", "cellbench.results.archived"),
    ("cellbench.config.detect_plan", "cellbench.results.loaders"),
    ("cellbench.config.images_command", "cellbench.runtime.images"),
    ("cellbench.config.jobargs", "cellbench.configs.collect"),
    ("cellbench.config.loader", "cellbench.tune.plan"),
    ("cellbench.config.loader", "cellbench.tune.shapes"),
    ("cellbench.config.model_plan", "cellbench.assets.build"),
    ("cellbench.config.model_plan", "cellbench.tune.shapes"),
    ("cellbench.config.serve_args", "cellbench.serve.server"),
}
CONFIG_MAY_IMPORT = ("common", "contracts", "stats", "config")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _checked(path: Path) -> bool:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] in CHECKED and rel.as_posix() not in NOT_YET


def _targets(path: Path) -> set[str]:
    """The cellbench modules ``path`` imports (lazy imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # ``from cellbench.x import y``: cellbench.x.y where y is a module, else cellbench.x
            names = [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] == "cellbench" and (target := _resolve(name)):
                out.add(target)
    return out


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_report_and_results_import_no_serve_module():
    found = sorted(
        f"{m} -> {t}"
        for m, p in MODULES.items()
        if _folder(m) in ("report", "results")
        for t in _targets(p)
        if _folder(t) == "serve"
    )
    assert found == []


def test_config_reaches_only_the_contracts_and_common_or_a_listed_edge():
    edges = {
        (m, t)
        for m, p in MODULES.items()
        if _folder(m) == "config" and _checked(p)
        for t in _targets(p)
        if _folder(t) not in CONFIG_MAY_IMPORT
    }
    assert sorted(edges - CONFIG_PENDING) == [], "config/ may import contracts, common, stats"
    assert sorted(CONFIG_PENDING - edges) == [], "an edge is gone: drop it from CONFIG_PENDING"


class _Refuse(importlib.abc.MetaPathFinder):
    """Acts out a machine without the optional packages: the only way to learn whether a
    module imports them at load time is to import it with them missing."""

    names = ("prometheus_client", "pynvml")

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"No module named {fullname!r} (refused by the test)")
        return None


@pytest.mark.parametrize(
    "module", ["cellbench.report.build", "cellbench.results.loaders", "cellbench.serve.job"]
)
def test_imports_without_prometheus_or_nvml(module):
    tops = ("cellbench", *_Refuse.names)

    def ours() -> dict:
        return {k: v for k, v in sys.modules.items() if k.split(".")[0] in tops}

    saved = ours()
    refuse = _Refuse()
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, refuse)
    try:
        importlib.import_module(module)
    finally:  # the modules other tests imported, as they were (third-party ones stay loaded)
        sys.meta_path.remove(refuse)
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)


def _private_imports(path: Path) -> list[str]:
    """``from cellbench.x import _name`` and ``module._name`` on an imported cellbench module."""
    tree = ast.parse(path.read_text())
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cellbench"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{node.module}.{a.name}")
                elif f"{node.module}.{a.name}" in MODULES:
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name.startswith("cellbench")}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    found = {m: names for m, p in MODULES.items() if _checked(p) and (names := _private_imports(p))}
    # ... nor does a module outside import a private name from one of these folders.
    for m, p in MODULES.items():
        if not _checked(p):
            inward = [n for n in _private_imports(p) if _folder(n) in CHECKED]
            if inward:
                found[m] = inward
    assert found == {}


def test_no_function_over_a_screen():
    long = []
    for m, p in MODULES.items():
        if not _checked(p):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{m}.{node.name}: {n} lines")
    assert long == []


ISSUE = re.compile(r"issue ?[0-9]+", re.I)
NAMED = ("workflow", "docs", "config", "benchmarks")
# Recorded outputs are kept as the runs wrote them; their names are checked all the same.
RECORDED = ROOT / "benchmarks" / "results"
# A file's path at a past commit, read with ``git show COMMIT:PATH``: that tree keeps its name.
AT_PAST_COMMIT = {("benchmarks/tuner_any_list.py", "issue33")}


def test_no_issue_number_in_names_or_text():
    names, texts = [], []
    for top in NAMED:
        for path in sorted((ROOT / top).rglob("*")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            if ISSUE.search(path.name.replace("_", " ")) or ISSUE.search(path.name):
                names.append(rel)
            if not path.is_file() or RECORDED in path.parents:
                continue
            if rel.removeprefix("workflow/cellbench/") in NOT_YET:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            texts += [
                f"{rel}: {m.group(0)}"
                for m in ISSUE.finditer(text)
                if (rel, m.group(0)) not in AT_PAST_COMMIT
            ]
    assert names == [] and texts == []
