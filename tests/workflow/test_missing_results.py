"""Missing and damaged stage results are rebuilt, and whole-run tables refuse a short set.

A finished-looking embedded-default run is made without running anything: every stage result
is written whole (``result_fixtures``, gate verdicts by ``cellbench.gates.check``), every other
declared output as a placeholder, and a real ``snakemake all --touch`` records them as done
(times in plan order, params in Snakemake's metadata). A real ``snakemake all -n`` then must
plan nothing, and after one result is deleted or damaged, exactly the job that writes it and
the jobs that read it, directly or not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cellbench import cli
from cellbench.archive import write as archive
from cellbench.common import atomicio
from cellbench.gates import check as gates
from cellbench.report import build as report
from cellbench.report import tidy
from cellbench.results import whole_sets
from support import result_fixtures as fx
from support.workflow_runs import fresh_copy

CELLS = ("host-cpu/tiny-qwen3-moe/tp1-ep1", "host-cpu/tiny-qwen3-moe-16e/tp1-ep1")
A = CELLS[0]
ARMS = ("untuned", "tuned")


def _snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "all", "--cores", "1", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _write_cell(res: Path, cell: str) -> None:
    fx.write_tune(res, cell)
    for arm in ARMS:
        fx.write_bench(res, cell, arm, [fx.point(seq=0), fx.point(seq=1, repeat=1)])
        fx.write_gsm8k(res, cell, arm, [True, False, True, True])
        (res / cell / "serve" / arm / "lm_eval").mkdir(parents=True, exist_ok=True)
        atomicio.write_tree_checksum(res / cell / "serve" / arm / "lm_eval")  # as serve does
    gates.main(["evaluate", "--cell", cell, "--model", cell.split("/")[1],
                "--untuned", str(res / cell / "gsm8k/untuned.json"),
                "--tuned", str(res / cell / "gsm8k/tuned.json"),
                "--out", str(res / cell / "gate.json")])  # fmt: skip


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """The embedded default's workflow with every output present and recorded as done."""
    work = fresh_copy(tmp_path_factory.mktemp("finished"))
    res = work / "results"
    for cell in CELLS:
        _write_cell(res, cell)
    _record_done(work)
    return work


def _record_done(work: Path, *args: str) -> None:
    """Every declared output not yet there made as a placeholder, then all of them recorded
    as done by a real `snakemake all --touch` (times in plan order, params in its metadata)."""
    listing = _snakemake(work, "--summary", *args)
    assert listing.returncode == 0, listing.stderr[-3000:]
    for line in listing.stdout.splitlines()[1:]:
        path = work / line.split("\t")[0]
        if path.exists():
            continue
        if path.suffix == "" or path.name == "bump":  # a directory output
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("placeholder\n")
    touched = _snakemake(work, "--touch", *args)
    assert touched.returncode == 0, touched.stderr[-3000:]


def _plan(work: Path) -> Counter:
    """Planned jobs per rule, and the job cells named in the plan."""
    proc = _snakemake(work, "-n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = Counter()
    for rule, wildcards in re.findall(
        r"^rule (\w+):\n(?:    .*\n)*?    wildcards: ([^\n]*)", proc.stdout, re.M
    ):
        model = re.search(r"model=([\w.-]+)", wildcards)
        cell = "-" if model is None else ("16e" if model.group(1).endswith("16e") else "8e")
        jobs[(rule, cell)] += 1
    for rule in re.findall(r"^(?:local)?rule (\w+):\n(?!(?:    .*\n)*?    wildcards)", proc.stdout,
                           re.M):  # fmt: skip
        jobs[(rule, "-")] += 1
    return jobs


# What rebuilding each of cell A's results plans (A's jobs are "8e"), besides those that read
# every cell: report, check_gates and all always; archive where a result is archived.
DEPENDENTS = {
    "tune/summary.json": {"tune", "serve_pair", "gsm8k", "gate", "plots", "configs", "archive"},
    "tune/configs": {"tune", "serve_pair", "gsm8k", "gate", "plots", "configs", "archive"},
    "serve/untuned/bench.json": {"serve_pair", "gsm8k", "gate", "plots", "archive"},
    "serve/tuned/lm_eval": {"serve_pair", "gsm8k", "gate", "plots", "archive"},
    "gsm8k/tuned.json": {"gsm8k", "gate", "plots", "archive"},
    "gate.json": {"gate", "archive"},
}


def test_a_finished_run_plans_nothing(finished):
    proc = _snakemake(finished, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.parametrize("rel", sorted(DEPENDENTS))
def test_a_deleted_result_is_rebuilt_with_its_readers(finished, rel, tmp_path):
    path = finished / "results" / A / rel
    aside = tmp_path / "aside"
    shutil.move(path, aside)
    try:
        plan = _plan(finished)
    finally:
        shutil.move(aside, path)
    rules_of_a = {rule for (rule, cell) in plan if cell == "8e"}
    cell_rules = DEPENDENTS[rel] - {"configs", "archive"}
    assert rules_of_a == cell_rules, plan
    assert not [k for k in plan if k[1] == "16e"], plan  # the other cell is not touched
    shared = {rule for (rule, cell) in plan if cell == "-"}
    expected = {"report", "check_gates", "all"} | (DEPENDENTS[rel] & {"configs", "archive"})
    assert shared == expected, plan


def test_a_deleted_figure_reruns_its_plots_job_and_the_report(finished, tmp_path):
    path = finished / f"results/report/embedded-cpu/plots/{A}/latency.png"
    shutil.copy(path, tmp_path / "keep")
    path.unlink()
    try:
        plan = _plan(finished)
    finally:
        shutil.copy(tmp_path / "keep", path)
    assert set(plan) == {("plots", "8e"), ("report", "-"), ("check_gates", "-"), ("all", "-")}


def _drop_sidecar(path: Path) -> None:
    atomicio.checksum_path(path).unlink()


def _edit_lm_eval(path: Path) -> None:
    (path / "results_2026-12-05T10-00-00.json").write_text('{"results": {}}')


@pytest.mark.parametrize(
    "rel, damage",
    [
        ("serve/tuned/bench.json", lambda p: p.write_text(p.read_text()[:50])),  # truncated
        ("gsm8k/untuned.json", lambda p: (p.unlink(), p.mkdir())),  # unreadable as a file
        ("tune/summary.json", lambda p: p.write_text(p.read_text().replace("64", "65"))),
        # Deleting the checksum does not switch the check off.
        ("serve/untuned/bench.json", _drop_sidecar),
        # lm-eval's folder is checked against what the serve job recorded of it.
        ("serve/tuned/lm_eval", _edit_lm_eval),
    ],
    ids=["truncated-bench", "folder-for-gsm8k", "tampered-summary", "bench-without-sidecar",
         "edited-lm-eval"],
)  # fmt: skip
def test_a_damaged_result_is_rebuilt_like_a_missing_one(finished, rel, damage, tmp_path):
    path = finished / "results" / A / rel
    keep = tmp_path / "keep"
    shutil.copytree(path, keep) if path.is_dir() else shutil.copy2(path, keep)
    sidecar = atomicio.checksum_path(path)
    shutil.copy2(sidecar, tmp_path / "keep.sha256") if sidecar.is_file() else None
    damage(path)
    try:
        proc = _snakemake(finished, "-n")
        plan = _plan(finished)
    finally:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        shutil.copytree(keep, path) if keep.is_dir() else shutil.copy2(keep, path)
        if (tmp_path / "keep.sha256").is_file():
            shutil.copy2(tmp_path / "keep.sha256", sidecar)
    terminal = proc.stdout + proc.stderr
    said = "" if rel.endswith("lm_eval") else "bad result file "
    said = f"result refused, its job is planned again: {said}results/{A}/{rel}"
    assert said in terminal, terminal[-3000:]
    writer = {"serve": "serve_pair", "gsm8k": "gsm8k", "tune": "tune"}[rel.split("/")[0]]
    assert (writer, "8e") in plan and ("report", "-") in plan, plan
    assert not [k for k in plan if k[1] == "16e"], plan


@pytest.mark.slow
def test_a_repaired_result_is_rebuilt_once_and_the_next_plan_is_empty(finished, tmp_path):
    """A refused gate verdict (its checksum deleted after an edit) is rebuilt by a real run of
    `all`; the plan after that repair is empty. (A refusal carried as a params value was
    recorded by the repairing job and planned it a second time.)"""
    work = tmp_path / "work"
    shutil.copytree(finished, work, symlinks=True)
    gate = work / "results" / A / "gate.json"
    data = json.loads(gate.read_text())
    data["passed"] = not data["passed"]
    data["checks"] = [dict(c, passed=data["passed"]) for c in data["checks"]]
    gate.write_text(json.dumps(data))
    atomicio.checksum_path(gate).unlink()
    plan = _plan(work)
    assert ("gate", "8e") in plan and not [k for k in plan if k[1] == "16e"], plan
    run = _snakemake(work)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert atomicio.checksum_path(gate).is_file()
    assert json.loads(gate.read_text())["passed"] != data["passed"]  # the edit is gone
    after = _snakemake(work, "-n")
    assert "Nothing to be done" in after.stdout + after.stderr, after.stdout[-3000:]


def _other_config(path: Path) -> Path:
    """A second config beside the embedded default, as the rehearsal is: its own image (so
    its own cells), run label and question count."""
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "config/local.yaml").read_text())
    config["run_label"] = "other-cpu"
    config["images"] = {"host-cpu-b": {"ref": "local/host-cpu-b:none"}}
    for group in config["cells"]:
        group["images"] = ["host-cpu-b"]
    config["gsm8k"].update(local_questions=20, dataset="results/assets/gsm8k/n20/gsm8k_test.jsonl")
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_another_configs_run_leaves_this_ones_plan_empty(finished, tmp_path):
    """A second config's whole run, recorded in the same results folder (its results hand-made,
    its other outputs recorded done by a real `--touch`), leaves the embedded default with
    nothing to do: its report, plan, gate summary and question set are in folders of their own.
    (When they were shared, Snakemake saw the embedded default's question set and report
    rewritten and planned them again with every serve job: 15 jobs.)"""
    work = tmp_path / "work"
    shutil.copytree(finished, work, symlinks=True)
    other = _other_config(tmp_path / "other.yaml")
    for cell in CELLS:
        _write_cell(work / "results", cell.replace("host-cpu/", "host-cpu-b/"))
    _record_done(work, "--configfile", str(other))
    assert "Nothing to be done" in _snakemake(work, "-n", "--configfile", str(other)).stdout
    after = _snakemake(work, "-n")
    assert "Nothing to be done" in after.stdout + after.stderr, after.stdout[-3000:]
    assert (work / "results/report/other-cpu/INDEX.json").is_file()
    assert (work / "results/assets/gsm8k/n20").is_dir()


# --- readers of whole-run tables ---------------------------------------------------------------


@pytest.fixture
def two_cells(tmp_path) -> Path:
    res = tmp_path / "results"
    for cell in CELLS:
        _write_cell(res, cell)
    return res


def test_tidy_refuses_a_set_with_a_missing_result_naming_it(two_cells, capsys):
    assert len(tidy.tidy(two_cells)) > 0
    missing = two_cells / A / "serve/tuned/bench.json"
    missing.unlink()
    with pytest.raises(whole_sets.IncompleteResults) as err:
        tidy.tidy(two_cells)
    message = str(err.value)
    assert str(missing) in message and "snakemake all --cores 2" in message
    assert cli.main(["tidy", str(two_cells)]) == 1
    err_text = capsys.readouterr().err
    assert str(missing) in err_text and "Traceback" not in err_text
    # A cell whose tune summary is gone is still seen (by its other stage folders) and named.
    (two_cells / CELLS[1] / "tune/summary.json").unlink()
    message = str(pytest.raises(whole_sets.IncompleteResults, tidy.tidy, two_cells).value)
    assert f"{CELLS[1]}/tune/summary.json" in message and str(missing) in message


def test_tidy_refuses_live_results_with_a_whole_cell_folder_missing(two_cells, capsys):
    """`cellbench tidy results` checks the cells against the config (the embedded default's
    two here): with one cell's folder gone it used to print a one-cell table and exit 0."""
    config = str(Path(__file__).resolve().parents[2] / "config/local.yaml")
    shutil.rmtree(two_cells / CELLS[1])
    assert cli.main(["tidy", str(two_cells), "--configfile", config]) == 1
    err = capsys.readouterr().err
    assert f"{two_cells}/{CELLS[1]}: (cell folder) = (absent)" in err, err
    assert f"every cell of --configfile {config}" in err and "Traceback" not in err


def test_report_cli_refuses_a_cell_without_an_arm(two_cells, tmp_path, capsys):
    files = [two_cells / c / rel for c in CELLS for rel in whole_sets.CELL_STAGE_FILES]
    files = [f for f in files if "gsm8k/tuned" not in str(f) or CELLS[1] not in str(f)]
    out = tmp_path / "report"
    assert report.main(["--out-dir", str(out), *map(str, files)]) == 1
    err = capsys.readouterr().err
    assert f"{CELLS[1]}/gsm8k/tuned.json" in err and "incomplete results" in err
    assert "snakemake all --cores 2" in err and not out.exists()


def test_archive_refuses_a_cell_without_a_result(two_cells, tmp_path):
    (two_cells / A / "gsm8k/untuned.json").unlink()
    root = tmp_path / "archive"
    with pytest.raises(whole_sets.IncompleteResults, match=re.escape(f"{A}/gsm8k/untuned.json")):
        archive.build_run("embedded-cpu", two_cells, list(CELLS), {}, "h", root, "local")
    assert not root.exists() or not any(root.rglob("MANIFEST.json"))


def test_tidy_of_an_archived_run_missing_a_file_names_it(two_cells, tmp_path, capsys):
    root = tmp_path / "archive"
    done = archive.build_run("embedded-cpu", two_cells, list(CELLS), {}, "h", root, "local")
    run_dir = root / "embedded-cpu" / done.run
    target = run_dir / A / "tune/summary.json"
    target.parent.chmod(0o755)
    target.unlink()
    assert tidy.main([str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert str(target) in err and "cellbench archive verify embedded-cpu/" in err
    json.loads((run_dir / "MANIFEST.json").read_text())  # the manifest itself untouched


def test_report_names_a_missing_figure_instead_of_linking_it(two_cells, tmp_path):
    from cellbench.report import plots

    out = tmp_path / "report"
    files = [two_cells / c / rel for c in CELLS for rel in whole_sets.CELL_STAGE_FILES]
    plots.main(["--results", str(two_cells), "--cell", A, "--out-dir", str(out / "plots" / A)])
    (out / "plots" / A / "latency.png").unlink()
    text = report.write_report(files, out, results=two_cells).read_text()
    assert "plots/" + A + "/latency.png)" not in text  # no link to nothing
    assert f"Figure `latency` is missing: rebuild it: `snakemake --cores 2 {out}/plots/{A}/" in text
    assert f"![gsm8k](plots/{A}/gsm8k.png)" in text
    # A cell whose plots job never ran gets no figure lines at all.
    assert f"plots/{CELLS[1]}/" not in text
