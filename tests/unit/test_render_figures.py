"""benchmarks/render_figures.py: the check fails on every kind of figure that drifts from its file.

Each test works on a small copy of the tree (one result file, one page) under tmp_path, so a
change made to the page or the file is exactly the fault under test.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
render_figures = importlib.import_module("render_figures")

RUN = "vllm_ops_h100_2026-12-05"
BF16 = f"{RUN}/builtin_vs_vllm_h200_bf16.txt"
PAGE = f"""# A run

On one <!-- fig card:{BF16} --><!-- /fig -->, against {{ops}}, the builtin's whole call is
<!-- fig bvv-range:{BF16} --><!-- /fig --> of vLLM's, at or below it at
<!-- fig bvv-le1:{BF16} --><!-- /fig --> of <!-- fig bvv-count:{BF16} --><!-- /fig --> batch
sizes.

<!-- table bvv-table:{BF16} -->
<!-- /table -->
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "benchmarks" / "results" / BF16
    src.parent.mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "results" / BF16, src)
    (tmp_path / "README.md").write_text(PAGE.replace("{ops}", "vLLM's ops"))
    assert render_figures.write(tmp_path) == []
    assert render_figures.check(tmp_path) == []
    return tmp_path


def edit(tree: Path, old: str, new: str) -> None:
    page = tree / "README.md"
    text = page.read_text()
    assert old in text, text
    page.write_text(text.replace(old, new, 1))


def test_the_page_is_rendered_from_the_file(tree):
    text = (tree / "README.md").read_text()
    # the run's own summary line says the same: "0.894-1.047; <= 1.00 at 8 of 18"
    assert "H100<!-- /fig -->" in text
    assert "0.894-1.047<!-- /fig -->" in text
    assert "-->8<!-- /fig --> of <!-- fig" in text and "-->18<!-- /fig -->" in text
    assert "| 2048 | 611.78 | 1.047 | 1.021 | 0.003 |" in text
    assert "vLLM's own compiled align" in text


def test_a_changed_unitless_ratio_fails(tree):
    edit(tree, "0.894-1.047", "0.894-1.037")
    (problem,) = render_figures.check(tree)
    assert "bvv-range" in problem and "'0.894-1.037'" in problem and "'0.894-1.047'" in problem


def test_a_changed_count_fails(tree):
    edit(tree, "-->8<!-- /fig -->", "-->18<!-- /fig -->")
    (problem,) = render_figures.check(tree)
    assert "bvv-le1" in problem and "'18'" in problem


def test_a_swapped_card_name_fails(tree):
    edit(tree, "H100<!-- /fig -->", "H200<!-- /fig -->")
    (problem,) = render_figures.check(tree)
    assert "card:" in problem and "'H200'" in problem and "'H100'" in problem


def test_a_changed_table_cell_fails(tree):
    edit(tree, "| 2048 | 611.78 | 1.047 |", "| 2048 | 611.78 | 0.997 |")
    (problem,) = render_figures.check(tree)
    assert "bvv-table" in problem


def test_a_deleted_source_fails_and_nothing_is_read_from_history(tree):
    (tree / "benchmarks" / "results" / BF16).unlink()
    problems = render_figures.check(tree)
    assert len(problems) == 5  # the card, the range, both counts and the table
    assert all(f"benchmarks/results/{BF16} missing from the working tree" in p for p in problems)
    # write leaves the page as it was rather than blanking its figures
    before = (tree / "README.md").read_text()
    assert render_figures.write(tree)
    assert (tree / "README.md").read_text() == before


@pytest.mark.parametrize(
    "sentence",
    [
        "The builtin is 0.986 of vLLM's at M=4096.",  # a ratio
        "It wins at 17 of 18 batch sizes.",  # a count
        "Measured on an H200.",  # a card
        "The run took 41 min.",  # a time
        "The suite ended 3 passed.",  # a test count
        "It ran 17 tests on the card.",  # a count of what a run did
    ],
)
def test_a_figure_added_to_the_prose_fails(tree, sentence):
    edit(tree, "# A run\n", f"# A run\n\n{sentence}\n")
    (problem,) = render_figures.check(tree)
    assert "figure outside the markers" in problem


def test_code_and_link_targets_are_not_prose(tree):
    code = "\n    BUDGET_S=300 bash run.sh     # 41 min on an H200\n\n"
    edit(tree, "# A run\n", f"# A run\n\n`BUDGET_S=300` and [the run](x/h100_0.986.md)\n{code}")
    assert render_figures.check(tree) == []


@pytest.mark.parametrize(
    "added",
    [
        "- a list item\n    whose continuation says 0.986 of vLLM's\n",  # not a code block
        "The run took `41 min`.\n",  # a figure alone in inline code is still a figure
    ],
)
def test_figures_dressed_as_code_still_count(tree, added):
    edit(tree, "# A run\n", f"# A run\n\n{added}")
    (problem,) = render_figures.check(tree)
    assert "figure outside the markers" in problem


def test_an_unknown_figure_name_fails(tree):
    edit(tree, "bvv-count:", "bvv-cnt:")
    (problem,) = render_figures.check(tree)
    assert "unknown figure family 'bvv-cnt'" in problem
