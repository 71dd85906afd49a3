"""In-container modules run inside the vLLM image, which has only the standard library, torch,
triton and vllm: they must import nothing else (no pandas, yaml, requests, docker, ...)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "workflow" / "cellbench"
# The tune stage runs in the image; it may use cellbench.common (standard library only) too.
IN_CONTAINER = ["tune", "common"]
# huggingface_hub comes with vLLM (it loads models through it), so every vLLM image has it.
ALLOWED = set(sys.stdlib_module_names) | {
    "torch",
    "triton",
    "vllm",
    "huggingface_hub",
    "cellbench",
    "__future__",
}
# Of cellbench itself, an in-container module may reach only these (the package root holds
# nothing but its version); every other stage folder is a host module.
IN_CONTAINER_PACKAGES = ("cellbench.tune", "cellbench.common")


def _host_only(module: str) -> bool:
    if module in ("cellbench", "cellbench.__version__"):
        return False
    return module.startswith("cellbench") and not any(
        module == p or module.startswith(p + ".") for p in IN_CONTAINER_PACKAGES
    )


def in_container_files() -> list[Path]:
    files = []
    for name in IN_CONTAINER:
        path = PACKAGE / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in files if f.exists()]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_in_container_modules_import_only_what_the_image_has():
    files = in_container_files()
    assert any(f.name == "shapes.py" for f in files)
    assert any(f.name == "atomicio.py" for f in files)
    offenders = {}
    for path in files:
        bad = sorted(
            m for m in imported_modules(path) if m.split(".")[0] not in ALLOWED or _host_only(m)
        )
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert offenders == {}
