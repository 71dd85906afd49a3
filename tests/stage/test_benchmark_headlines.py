"""benchmarks/README.md's headline figures match the committed outputs they name.

Runs benchmarks/headline_figures.py, which recomputes each figure from its file under
benchmarks/results/ and fails when the README does not quote it verbatim.
"""

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
