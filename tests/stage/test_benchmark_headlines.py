"""benchmarks/README.md's headline figures match the committed outputs they name.

Runs benchmarks/headline_figures.py, which recomputes each figure from its file under
benchmarks/results/ and fails when the README does not quote it verbatim.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "headline_figures.py"


def test_every_headline_figure_is_what_its_file_holds():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60
    )
    missing = [line for line in run.stdout.splitlines() if line.endswith("| NO |")]
    assert run.returncode == 0, f"figures not quoted as their files hold: {missing}\n{run.stderr}"
    # the table lists one row per figure: an empty table would pass the check vacuously
    assert sum(line.endswith("| yes |") for line in run.stdout.splitlines()) >= 40


def test_a_changed_figure_is_caught(tmp_path, monkeypatch):
    # The check must fail on a README whose figure differs from its file: run 5's pick range,
    # once quoted as 0.998-1.011x while its file holds 0.991-1.011x.
    import importlib.util

    spec = importlib.util.spec_from_file_location("headline_figures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = tmp_path / "README.md"
    text = mod.README.read_text()
    assert "0.991-1.011x" in text
    readme.write_text(text.replace("0.991-1.011x", "0.998-1.011x"))
    monkeypatch.setattr(mod, "README", readme)
    monkeypatch.setattr(sys, "argv", ["headline_figures.py", "--check"])
    assert mod.main() == 1


DOC_FIGURES = ROOT / "benchmarks" / "doc_figures.py"


def _doc_figures_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_figures", DOC_FIGURES)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["doc_figures"] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def test_every_figure_of_readme_docs_and_benchmarks_is_traced_or_counted():
    """README.md, docs/*.md and benchmarks/**/*.md: each figure is a headline figure, in a
    claim whose quote and evidence both exist, or one of its page's counted untraced ones."""
    run = subprocess.run(
        [sys.executable, str(DOC_FIGURES), "--check"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (claims,) = re.findall(r"^(\d+) claims; 0 problem\(s\)$", run.stderr, re.M)
    assert int(claims) >= 30
    # No page has an untraced figure left (issue 33): every figure is in a claim or a headline.
    assert _doc_figures_module().UNTRACED == {}


def test_doc_figures_catches_a_changed_quote_a_changed_source_and_a_new_figure(
    tmp_path, monkeypatch
):
    mod = _doc_figures_module()
    (claim,) = [c for c in mod.CLAIMS if c.page == "README.md" and "7 min 17 s" in c.quote]
    readme = (ROOT / "README.md").read_text()
    source = (ROOT / claim.source).read_text()
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / claim.source).parent.mkdir(parents=True)
    (tmp_path / claim.source).write_text(source)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "CLAIMS", [claim])
    monkeypatch.setattr(mod, "UNTRACED", {})
    monkeypatch.setattr(mod, "scanned_pages", lambda: ["README.md"])
    monkeypatch.setattr(mod, "headline_strings", lambda: [])
    # The README's other figure (the Slurm run's count) has no claim here: one untraced figure.
    assert [p for p in mod.check() if "took 7 min 17 s" in p] == []
    # The quote changed: the claim breaks and its figure is untraced.
    (tmp_path / "README.md").write_text(readme.replace("7 min 17 s", "9 min 17 s"))
    problems = mod.check()
    assert f"README.md: quote not found: {claim.quote!r}" in problems
    assert any("untraced figure '9 min'" in p for p in problems), problems
    # The source no longer holds the evidence.
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / claim.source).write_text(source.replace("7:16.81", "7:59.00"))
    assert f"README.md: {claim.source} does not hold {claim.evidence!r}" in mod.check()
    # A new figure without a claim.
    (tmp_path / claim.source).write_text(source)
    (tmp_path / "README.md").write_text(readme + "\nThe suite takes 37 min here.\n")
    assert any("untraced figure '37 min'" in p for p in mod.check())
