"""The append-only archive (cellbench.archive.write): run folders that are never rewritten, the same
run archived twice adds nothing, `verify` names every changed, missing and extra file, `list`,
`show` and `diff` read it back, and the report compares a re-measured cell with its previous
archived run.

Every input is a real result file written through result_fixtures.py, with chosen values; the
archive is built by the real code into tmp_path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cellbench import cli
from cellbench.archive import write as archive
from cellbench.common.atomicio import sha256_file
from cellbench.report import build as report
from cellbench.results import archived as archive_read
from support import result_fixtures as fx
from support.archive_cells import tree_checksums, write_cell  # noqa: F401

CELL_A = "rocm7.2/tiny-a/tp1-ep1"
CELL_B = "rocm7.2/tiny-b/tp1-ep1"
CELLS = [CELL_A, CELL_B]
DIGESTS = {"rocm7.2": fx.DIGEST}
NEW_DIGEST = "sha256:" + "d" * 64


def build(res: Path, root: Path, digests: dict | None = None) -> int:
    digests = digests or DIGESTS
    args = ["build", "--label", "rocm7.2", "--results", str(res), "--cells", *CELLS]
    args += ["--digests", *[f"{k}={v}" for k, v in digests.items()]]
    args += ["--config-hash", "f00", "--archive-root", str(root)]
    return archive.main(args)


def run_dirs(label_dir: Path) -> list[str]:
    return sorted(
        p.name
        for p in label_dir.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    )


@pytest.fixture
def archived(tmp_path, capsys):
    res, root = tmp_path / "results", tmp_path / "archive"
    for cell in CELLS:
        write_cell(res, cell)
    assert build(res, root) == 0
    capsys.readouterr()
    return res, root


def test_run_folder_holds_results_report_and_manifest(archived):
    res, root = archived
    label = root / "rocm7.2"
    (run,) = run_dirs(label)
    assert run.endswith("_rocm7.2-" + fx.DIGEST.removeprefix("sha256:")[:12])
    assert os.readlink(label / "latest") == run
    receipt = json.loads((label / "ARCHIVED.json").read_text())
    assert (receipt["run"], receipt["added"]) == (run, True)
    assert receipt["manifest_sha256"] == sha256_file(label / run / "MANIFEST.json")
    manifest = json.loads((label / run / "MANIFEST.json").read_text())
    on_disk = tree_checksums(label / run)
    del on_disk["MANIFEST.json"]
    assert manifest["files"] == on_disk
    assert f"{CELL_A}/serve/tuned/bench.json" in manifest["files"]
    assert "report/report.md" in manifest["files"]
    assert manifest["images"] == DIGESTS and manifest["config_sha256"] == "f00"
    assert manifest["git"]["commit"] and manifest["git"]["dirty"] in (True, False)
    assert manifest["git"]["source"] == "git"
    summary = json.loads((res / CELL_A / "tune/summary.json").read_text())
    measured = manifest["tuner_packages"][CELL_A]
    assert (measured["triton"], measured["tuner"]) == (
        summary["triton_version"],
        summary.get("tuner_version"),
    )
    # Start and end of the measurement: the earliest and latest times the serve files record.
    times = sorted(
        p["started_at"]
        for cell in CELLS
        for arm in ("untuned", "tuned")
        for p in json.loads((res / cell / f"serve/{arm}/bench.json").read_text())["points"]
    )
    window = manifest["measured"]
    assert (window["start"], window["end"]) == (times[0], times[-1])
    assert f"{CELL_B}/serve/untuned/bench.json" in window["read_from"]
    # Archived files are read-only: nothing writes into a run folder after it is in place.
    assert not any(p.stat().st_mode & 0o222 for p in (label / run).rglob("*") if p.is_file())


def test_same_run_adds_nothing_and_a_remeasure_adds_a_run(archived, capsys):
    res, root = archived
    label = root / "rocm7.2"
    (first,) = run_dirs(label)
    before = tree_checksums(label / first)
    # A write under way in a cell folder (atomicio's temporary name) is not part of a run.
    (res / CELL_A / "serve" / ".bench.json.x1y2.tmp").write_text("half")

    assert build(res, root) == 0
    out = capsys.readouterr().out
    assert "already archived" in out and "nothing added" in out and first in out
    assert run_dirs(label) == [first]
    assert json.loads((label / "ARCHIVED.json").read_text())["added"] is False

    write_cell(res, CELL_A, ttft=150.0)  # re-measured: other numbers, same digest
    assert build(res, root) == 0
    assert "as a new run" in capsys.readouterr().out
    runs = run_dirs(label)
    assert len(runs) == 2 and first in runs
    (second,) = set(runs) - {first}
    assert tree_checksums(label / first) == before  # the earlier run, byte for byte
    assert os.readlink(label / "latest") == second
    receipt = json.loads((label / "ARCHIVED.json").read_text())
    assert (receipt["run"], receipt["added"]) == (second, True)
    assert not [p for p in label.iterdir() if p.name.startswith(".")]  # no staging left


def test_failed_build_adds_nothing(archived, capsys):
    res, root = archived
    label = root / "rocm7.2"
    runs, latest = run_dirs(label), os.readlink(label / "latest")
    (res / CELL_B / "gsm8k" / "tuned.json").unlink()
    (res / CELL_B / "serve" / "tuned" / "bench.json").write_text("{}")
    assert build(res, root) == 1
    err = capsys.readouterr().err
    assert str(res / CELL_B / "serve" / "tuned" / "bench.json") in err
    assert f"no run was added; {label} keeps its earlier runs (1) as they were" in err
    assert run_dirs(label) == runs and os.readlink(label / "latest") == latest
    assert not [p for p in label.iterdir() if p.name.startswith(".")]


def test_verify_names_changed_missing_and_extra_files(archived, capsys):
    _, root = archived
    (run,) = run_dirs(root / "rocm7.2")
    folder = root / "rocm7.2" / run
    assert archive.main(["verify", "--archive-root", str(root)]) == 0
    assert f"ok\trocm7.2/{run}" in capsys.readouterr().out

    changed = folder / CELL_A / "serve/tuned/bench.json"
    os.chmod(changed, 0o644)
    data = bytearray(changed.read_bytes())
    data[10] ^= 1  # one bit of one byte
    changed.write_bytes(bytes(data))
    removed = f"{CELL_B}/gsm8k/untuned.json"
    (folder / removed).unlink()
    (folder / CELL_A / "notes.txt").write_text("added later\n")

    assert archive.main(["verify", f"rocm7.2/{run}", "--archive-root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"changed: {CELL_A}/serve/tuned/bench.json" in out
    assert f"missing: {removed}" in out
    assert f"extra: {CELL_A}/notes.txt" in out
    assert len([line for line in out.splitlines() if line.startswith("FAILED")]) == 3
    assert archive_read.verify(folder / "MANIFEST.json") == sorted(
        [f"{CELL_A}/serve/tuned/bench.json", removed, f"{CELL_A}/notes.txt"]
    )
    # Through `cellbench archive`, the same answer.
    assert cli.main(["archive", "verify", "--archive-root", str(root)]) == 1


def test_list_show_and_latest(archived, capsys):
    res, root = archived
    write_cell(res, CELL_A, ttft=150.0, digest=NEW_DIGEST)
    assert build(res, root, {"rocm7.2": NEW_DIGEST}) == 0
    first, second = run_dirs(root / "rocm7.2")
    capsys.readouterr()

    assert cli.main(["archive", "list", "--archive-root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["label", "run", "created", "cells", "digests", "files"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[1] for r in rows] == [first, f"{second} (latest)"]
    for row, digest in zip(rows, (fx.DIGEST, NEW_DIGEST), strict=True):
        manifest = json.loads((root / "rocm7.2" / row[1].split()[0] / "MANIFEST.json").read_text())
        assert row[0] == "rocm7.2" and row[2] == manifest["created"]
        assert row[3] == "2" and row[4] == f"rocm7.2={digest}"
        assert row[5] == str(len(manifest["files"]))

    assert archive.main(["show", "latest", "--archive-root", str(root)]) == 0
    text = capsys.readouterr().out
    assert f"run:        rocm7.2/{second}" in text
    assert f"rocm7.2: {NEW_DIGEST}" in text and "sha256 f00" in text
    assert f"{CELL_A}: tuner: platform cpu, torch 2.13.0+cpu, triton 3.9.0" in text
    manifest = json.loads((root / "rocm7.2" / second / "MANIFEST.json").read_text())
    assert f"measured:   {manifest['measured']['start']} .. {manifest['measured']['end']}" in text
    assert f"files ({len(manifest['files'])}):" in text
    assert archive.main(["show", first, "--json", "--archive-root", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == first


def test_diff_two_runs(archived, capsys):
    res, root = archived
    write_cell(res, CELL_A, ttft=150.0, digest=NEW_DIGEST)  # TTFT up by half, TPOT as it was
    assert build(res, root, {"rocm7.2": NEW_DIGEST}) == 0
    first, second = run_dirs(root / "rocm7.2")
    capsys.readouterr()
    assert cli.main(["archive", "diff", first, second, "--archive-root", str(root)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"# rocm7.2/{first} (A) vs rocm7.2/{second} (B)")
    assert text.count(f"## {CELL_A}") == 1 and text.count(f"## {CELL_B}") == 1
    # One table per cell and arm, with the verdict column, and GSM8K paired per question.
    assert text.count("| verdict") >= 4 and text.count("#### untuned arm") == 2
    assert "GSM8K, paired by `doc_id` on 20 questions" in text
    ttft_rows = [r for r in text.splitlines() if "| mean_ttft_ms" in r]
    assert len(ttft_rows) == 4
    # CELL_A's TTFT went from ~100 to ~150 ms: "worse" on both arms; CELL_B is unchanged, yet
    # two runs never interleaved are compared unpaired, on 3 starts a side: not narrow enough
    # for +-2%, so inconclusive, with what it could have seen.
    assert sum("| worse " in r for r in ttft_rows) == 2
    assert sum("| inconclusive " in r for r in ttft_rows) == 2
    assert all("| unpaired " in r for r in ttft_rows)


def test_diff_and_show_errors_are_one_line(archived, capsys, tmp_path):
    _, root = archived
    (run,) = run_dirs(root / "rocm7.2")
    assert archive.main(["diff", run, "nope", "--archive-root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"cellbench archive: error: no archived run 'nope' in {root} " + (
        f"(`python -m cellbench.archive list --archive-root {root}` lists 1)"
    )
    # A run of other cells: nothing in common.
    other = tmp_path / "other"
    write_cell(other, "rocm7.0/tiny-a/tp1-ep1")
    args = ["build", "--label", "rocm7.0", "--results", str(other)]
    args += ["--cells", "rocm7.0/tiny-a/tp1-ep1", "--digests", f"rocm7.0={fx.DIGEST}"]
    assert archive.main([*args, "--config-hash", "f00", "--archive-root", str(root)]) == 0
    (run_b,) = run_dirs(root / "rocm7.0")
    capsys.readouterr()
    assert archive.main(["diff", run, run_b, "--archive-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "hold no cell in common" in err
    # Two labels: a bare `latest` is ambiguous, LABEL/latest is not.
    assert archive.main(["show", "latest", "--archive-root", str(root)]) == 2
    assert "rocm7.0/latest, rocm7.2/latest" in capsys.readouterr().err
    assert archive.main(["show", "rocm7.0/latest", "--archive-root", str(root)]) == 0


def _report(res: Path, root: Path | None) -> str:
    files = [p for cell in CELLS for p in archive.stage_results(res / cell)]
    path = report.write_report(files, res / "report", results=res, archive_root=root)
    return path.read_text()


def test_report_compares_exactly_the_changed_cells(archived):
    res, root = archived
    (first,) = run_dirs(root / "rocm7.2")
    # Archived from these very results: no previous run differs, so no section.
    assert ": previous run" not in _report(res, root)

    write_cell(res, CELL_A, ttft=150.0, digest=NEW_DIGEST)
    text = _report(res, root)
    heading = f"## {CELL_A}: previous run rocm7.2/{first} (digest {fx.DIGEST}) vs now "
    assert heading + f"(digest {NEW_DIGEST})" in text
    assert text.count(": previous run") == 1  # CELL_B was not re-measured
    assert "Image bump: A is the run archived as" in text
    section = text[text.index(heading) :]
    assert "#### untuned arm: previous (A) vs now (B)" in section
    assert "#### tuned arm: previous (A) vs now (B)" in section

    # The new results archived too: the newest run now holds them and is passed over, so the
    # comparison is still with the run before.
    assert build(res, root, {"rocm7.2": NEW_DIGEST}) == 0
    assert heading in _report(res, root)

    # Re-measured again on the same digest: compared with the run just archived.
    write_cell(res, CELL_A, ttft=120.0, digest=NEW_DIGEST)
    text = _report(res, root)
    (_, second) = run_dirs(root / "rocm7.2")
    assert f"## {CELL_A}: previous run rocm7.2/{second} (digest {NEW_DIGEST}) vs now" in text
    assert "Re-measured, same digest: A is" in text
    assert text.count(": previous run") == 1


def test_report_notes_a_previous_run_that_fails_its_check(archived):
    res, root = archived
    (first,) = run_dirs(root / "rocm7.2")
    write_cell(res, CELL_A, ttft=150.0)
    copy = root / "rocm7.2" / first / CELL_A / "gsm8k" / "tuned.json"
    copy.chmod(0o644)
    copy.write_text(copy.read_text().replace('"num_fewshot": 5', '"num_fewshot": 6'))
    text = _report(res, root)  # the report is still written
    assert f"## {CELL_A}: previous run rocm7.2/{first} not compared" in text
    assert "changed after it was written" in text
    assert f"`cellbench archive verify rocm7.2/{first}`" in text
