"""Every published figure is what its result file gives: benchmarks/render_figures.py --check.

The check renders README.md, docs/*.md and benchmarks/**/*.md again from the files under
benchmarks/results/ (only from the working tree) and fails on any difference, on a missing
source and on a figure left in prose outside the markers. The unit tests
(tests/unit/test_render_figures.py) prove each kind of drift fails on a small tree; these run
the real script on the real tree, and on a copy of it with one fault each.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "render_figures.py"
NOTES = "benchmarks/NOTES-kernel.md"
H100_BF16 = "benchmarks/results/vllm_ops_h100_2026-12-05/builtin_vs_vllm_h200_bf16.txt"


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "benchmarks" / "render_figures.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_published_figure_is_what_its_file_gives():
    run = run_check(ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.strip().endswith("0 problem(s)")
    # the pages hold many rendered figures: an empty set of markers would pass vacuously
    listing = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0
    rows = [r for r in listing.stdout.splitlines() if r.startswith("| ") and "ERROR" not in r]
    assert len(rows) >= 100, listing.stdout[-2000:]
    assert not [r for r in listing.stdout.splitlines() if "ERROR" in r]


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    # the pages and every file a figure is read from (results, code, schemas, test bounds)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in ("docs", "benchmarks", "workflow", ".ci", "tests/workflow"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=skip)
    assert run_check(tmp_path).returncode == 0
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    "old,new",
    [
        ("-->8<!-- /fig -->", "-->9<!-- /fig -->"),  # a count
        ("-->0.894-1.047<!-- /fig -->", "-->0.894-1.037<!-- /fig -->"),  # a unitless ratio
        ("-->H100<!-- /fig -->", "-->H200<!-- /fig -->"),  # a card
    ],
)
def test_the_real_pages_fail_on_a_changed_figure(tree_copy, old, new):
    edit(tree_copy / NOTES, old, new)
    run = run_check(tree_copy)
    assert run.returncode == 1
    assert re.search(rf"^{re.escape(NOTES)}: .* reads '{re.escape(new[3:-13])}'", run.stderr, re.M)


def test_the_real_pages_fail_on_a_deleted_source(tree_copy):
    (tree_copy / H100_BF16).unlink()
    run = run_check(tree_copy)
    assert run.returncode == 1
    assert f"source {H100_BF16} missing from the working tree" in run.stderr
