"""In-container modules run inside the vLLM image, which has only the standard library, torch,
triton and vllm: they must import nothing else (no pandas, yaml, requests, docker, ...)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workflow" / "cellbench"
IN_CONTAINER = ["shapes.py", "kernels", "tuner"]
# huggingface_hub comes with vLLM (it loads models through it), so every vLLM image has it.
ALLOWED = set(sys.stdlib_module_names) | {
    "torch",
    "triton",
    "vllm",
    "huggingface_hub",
    "cellbench",
    "__future__",
}
# Host modules an in-container module may never reach, even through cellbench itself.
HOST_ONLY = {
    "cellbench.config",
    "cellbench.report",
    "cellbench.archive",
    "cellbench.images",
    "cellbench.container",
    "cellbench.steps",
    "cellbench.serve_stage",
    "cellbench.loadgen",
    "cellbench.server",
    "cellbench.gsm8k",
    "cellbench.assets",
    "cellbench.pins",
    "cellbench.cli",
    "cellbench.leases",
}


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
    offenders = {}
    for path in files:
        bad = sorted(
            m for m in imported_modules(path) if m.split(".")[0] not in ALLOWED or m in HOST_ONLY
        )
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert offenders == {}
