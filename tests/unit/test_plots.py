"""Figures per cell (cellbench.report.plots): real matplotlib output from result files written the
stages' way (tests/support/t21_cells.py), checked by decoding the PNGs and reading the SVGs'
text."""

from __future__ import annotations

import json
import re

import matplotlib.image as mpimg
import pytest
from cellbench.archive import write as archive
from cellbench.common import atomicio
from cellbench.contracts.result_file import ResultError
from cellbench.report import build as report
from cellbench.report import frames, plots, tidy
from cellbench.results import archived
from cellbench.stats import comparison
from support import result_fixtures as fx
from support import t21_cells as cells

# (width, height) in inches of each figure, as plots.py draws them.
SIZES = {"latency": (13, 4.2), "arm_change": (9, 5), "tuner_speedup": (12, 4.2),
         "gsm8k": (12, 4.2)}  # fmt: skip


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "results"
    cells.write_cell(res)
    return res


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """One cell's results and the figures draw_cell wrote for it (what it returned), made
    once for the tests that only read them: drawing is most of tests/unit's time."""
    res = tmp_path_factory.mktemp("plots") / "results"
    cells.write_cell(res)
    return res, plots.draw_cell(res, cells.CELL, plots.plot_dir(res, cells.CELL))


def svg_text(path) -> str:
    """The text elements of an SVG (matplotlib writes them as <text> with svg.fonttype none)."""
    return " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text()))


def test_every_figure_is_a_real_image_of_its_size(drawn):
    results, written = drawn
    out = plots.plot_dir(results, cells.CELL)
    assert sorted(p.name for p in written) == sorted(
        f"{name}.{fmt}" for name in plots.ALWAYS for fmt in plots.FORMATS
    )
    paths = plots.plot_paths(results, cells.CELL)
    assert set(paths) == set(plots.PLOT_NAMES)
    for name, (w, h) in SIZES.items():
        image = mpimg.imread(paths[name]["png"])
        assert image.shape[:2] == (round(h * plots.DPI), round(w * plots.DPI)), name
        assert image.std() > 0.01, f"{name}.png is blank"
    # No previous run: the bump folder exists (the rule declares it) and is empty.
    assert (out / "bump").is_dir() and not any((out / "bump").iterdir())


def test_svgs_carry_their_labels(drawn):
    results, _ = drawn
    out = plots.plot_dir(results, cells.CELL)
    latency = svg_text(out / "latency.svg")
    for title, _ in plots.LATENCY_PANELS:
        assert title in latency
    assert "ISL-OSL" in latency and "Triton MoE Tuned" in latency
    for isl, osl in cells.GRID:
        assert f"{isl}-{osl}" in latency
    # One bar label per compared grid point and metric: the report's comparison rows.
    rows = comparison.compare_serve(*(tidy_side(results, arm) for arm in ("untuned", "tuned")))
    change = svg_text(out / "arm_change.svg")
    assert "change of the geometric mean over server starts, % (the verdict's interval)" in change
    for answer in ("better", "worse", "equivalent", "inconclusive"):
        assert answer in change  # the legend: the four answers
    for r in rows:
        label = f"{plots.METRIC_LABELS[r['metric']]} {r['isl']}-{r['osl']}"
        assert label in change
    speed = svg_text(out / "tuner_speedup.svg")
    assert "speed-up (baseline time / pick time)" in speed and "roofline fraction" in speed
    assert "batch size M (tokens)" in speed
    gsm = svg_text(out / "gsm8k.svg")
    assert "accuracy, % (± stderr)" in gsm and "paired by doc_id" in gsm
    assert "fixed" in gsm and "broken" in gsm


def tidy_side(results, arm):
    files = tidy.stage_files(results, [cells.CELL])
    serve, _, _ = frames.load_tables(files, results)
    return serve[serve.arm == arm]


def test_absent_data_is_said_in_the_figure(tmp_path):
    """A cell with a tuner summary without baselines and no GSM8K: the figures say so."""
    res = tmp_path / "results"
    fx.write_tune(res, cells.CELL)
    fx.write_bench(res, cells.CELL, "tuned", [fx.point()])
    out = tmp_path / "plots"
    plots.draw_cell(res, cells.CELL, out)
    assert "no baseline timed beside the pick" in svg_text(out / "tuner_speedup.svg")
    assert "no GSM8K results" in svg_text(out / "gsm8k.svg")
    assert "both arms were not measured" in svg_text(out / "arm_change.svg")


def test_bump_against_the_previous_archived_run(results, tmp_path):
    """An archived run, then the cell re-measured on a new digest: the bump figure appears,
    names both digests, and goes again when there is no previous run any more."""
    root = tmp_path / "archive"
    old_digest = fx.DIGEST
    archive.build_run("rocm7.2", results, [cells.CELL], {"rocm7.2": old_digest}, "h",
                      archive_root=root)  # fmt: skip
    new_digest = "sha256:" + "d" * 64
    for arm in ("untuned", "tuned"):
        path = results / cells.CELL / "serve" / arm / "bench.json"
        data = json.loads(path.read_text())
        data["image_digest"] = new_digest
        for p in data["points"]:
            p["mean_ttft_ms"] *= 1.5
        atomicio.write_json(path, data, checksum=True)
    out = plots.plot_dir(results, cells.CELL)
    written = plots.draw_cell(results, cells.CELL, out, archive_root=root)
    bump = plots.plot_paths(results, cells.CELL)["bump"]
    assert bump["png"] in written and bump["svg"] in written
    assert mpimg.imread(bump["png"]).std() > 0.01
    text = svg_text(bump["svg"])
    assert old_digest in text and new_digest in text and "tuned arm: now vs previous" in text
    # Drawn again without the archive: the stale bump figure is removed.
    plots.draw_cell(results, cells.CELL, out)
    assert not bump["png"].exists()


def test_report_links_the_figures_and_keeps_them(results):
    out = plots.plot_dir(results, cells.CELL)
    plots.draw_cell(results, cells.CELL, out)
    files = tidy.stage_files(results, [cells.CELL])
    text = report.write_report(files, results / "report", results=results).read_text()
    for name in plots.ALWAYS:
        link = f"![{name}](plots/{cells.CELL}/{name}.png)"
        assert link in text
    assert "bump" not in text  # no previous run
    # The plots jobs' files survived the report's swap, and every link resolves.
    for rel in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (results / "report" / rel).is_file(), rel
    # A failed report leaves report.md and the figures as they were.
    before = (results / "report" / "report.md").read_text()
    bad = results / cells.CELL / "serve" / "tuned" / "bench.json"
    data = json.loads(bad.read_text())
    data["points"][0]["completed"] = 10_000
    bad.write_text(json.dumps(data))
    with pytest.raises(ResultError):
        report.write_report(files, results / "report", results=results)
    assert (results / "report" / "report.md").read_text() == before
    assert all(p["png"].is_file() for n, p in plots.plot_paths(results, cells.CELL).items()
               if n != "bump")  # fmt: skip


def test_archived_run_has_its_own_figures(results, tmp_path):
    """The archive draws the run's figures with the same code, into the run's report."""
    root = tmp_path / "archive"
    done = archive.build_run("rocm7.2", results, [cells.CELL], {"rocm7.2": fx.DIGEST}, "h",
                             archive_root=root)  # fmt: skip
    run_dir = root / "rocm7.2" / done.run
    paths = plots.plot_paths(run_dir, cells.CELL)
    for name in plots.ALWAYS:
        assert mpimg.imread(paths[name]["png"]).shape[2] in (3, 4)
    text = (run_dir / "report" / "report.md").read_text()
    assert f"![latency](plots/{cells.CELL}/latency.png)" in text
    assert archived.verify(run_dir / "MANIFEST.json") == []


def test_cli_refuses_a_bad_cell_and_a_bad_input(results, tmp_path, capsys):
    with pytest.raises(SystemExit):
        plots.main(["--results", str(results), "--cell", "rocm7.2/tiny-a"])
    bad = results / cells.CELL / "gsm8k" / "tuned.json"
    bad.write_text("{")
    assert plots.main(["--results", str(results), "--cell", cells.CELL,
                       "--out-dir", str(tmp_path / "p")]) == 1  # fmt: skip
    assert "gsm8k/tuned.json" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
