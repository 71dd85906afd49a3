"""Checked result loading (cellbench.results.loaders): every bad file is refused by name, field and
value, with the job to rerun; a failed report or archive keeps the previous one.

The files are real files on disk, written the way the stages write them (result_fixtures.py);
each test breaks one thing. The last test runs the report rule twice through real Snakemake.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench.archive import write as archive
from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import ResultError
from cellbench.report import build as report
from cellbench.results import archived, loaders
from support import result_fixtures as fx
from support.workflow_runs import fresh_copy

CELL = "rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2"


def _points(n: int = 2) -> list[dict]:
    return [fx.point(512, 512, repeat=r, seq=r, ttft=100.0 + r) for r in range(n)]


def _cell(res: Path, cell: str = CELL) -> list[Path]:
    """A whole cell: tune, both arms' bench.json and GSM8K."""
    files = [fx.write_tune(res, cell)]
    for arm in ("untuned", "tuned"):
        files.append(fx.write_bench(res, cell, arm, _points()))
        files.append(fx.write_gsm8k(res, cell, arm, [True, False, True, True]))
    return files


def _refused(path: Path, res: Path | None = None) -> str:
    with pytest.raises(ResultError) as info:
        loaders.load(path, res)
    message = str(info.value)
    assert str(path) in message  # the file, by name
    assert "--forcerun" in message  # and the job to rerun
    return message


def _rewrite(path: Path, edit, *, checksum: bool = True) -> None:
    """Change a file's content as a faulty stage would have written it (a fresh checksum), or
    as a later hand edit would (``checksum=False``: the recorded one no longer matches)."""
    data = json.loads(path.read_text())
    edit(data)
    if checksum:
        atomicio.write_json(path, data, checksum=True)
    else:
        path.write_text(json.dumps(data))


def test_whole_results_load_and_are_verified(tmp_path):
    res = tmp_path / "results"
    for path in _cell(res):
        loaded = loaders.load(path, res)
        assert loaded.checksum == result_file.VERIFIED
        assert loaded.sha256 == atomicio.sha256_file(path)
    assert loaders.load(res / CELL / "tune/summary.json").data["entries"]["4"]["config"]


def test_negative_ttft_is_refused(tmp_path):
    res = tmp_path / "results"
    path = fx.write_bench(res, CELL, "tuned", _points())
    _rewrite(path, lambda d: d["points"][1].update(mean_ttft_ms=-5.0))
    message = _refused(path, res)
    assert "points[1].mean_ttft_ms = -5.0" in message and "minimum of 0" in message
    assert f"--forcerun {path}" in message


def test_more_completed_than_prompts_sent_is_refused(tmp_path):
    res = tmp_path / "results"
    path = fx.write_bench(res, CELL, "untuned", [fx.point(prompts=4)])
    _rewrite(path, lambda d: d["points"][0].update(completed=400))
    message = _refused(path, res)
    assert "points[0].completed = 400" in message
    assert "completed + failed (400 + 0) must equal the prompts sent, num_prompts = 4" in message


def test_median_above_p99_is_refused(tmp_path):
    path = fx.write_bench(tmp_path, CELL, "tuned", [fx.point(tpot=3.0)])
    _rewrite(path, lambda d: d["points"][0].update(median_tpot_ms=7.0))
    assert "points[0].median_tpot_ms = 7.0: a median cannot exceed the p99" in _refused(path)


def test_bench_in_another_cells_folder_is_refused(tmp_path):
    res = tmp_path / "results"
    path = fx.write_bench(res, CELL, "tuned", _points())
    moved = res / "rocm7.0/qwen3-30b-a3b-fp8/tp2-ep2/serve/tuned/bench.json"
    moved.parent.mkdir(parents=True)
    shutil.copy(path, moved)
    shutil.copy(atomicio.checksum_path(path), atomicio.checksum_path(moved))
    assert f'cell = "{CELL}": the cell of its folder ("rocm7.0/' in _refused(moved, res)
    wrong_arm = res / CELL / "serve/untuned/bench.json"
    wrong_arm.parent.mkdir(parents=True)
    shutil.copy(path, wrong_arm)
    shutil.copy(atomicio.checksum_path(path), atomicio.checksum_path(wrong_arm))
    assert 'arm = "tuned": the arm of its folder ("untuned")' in _refused(wrong_arm, res)


def test_missing_provenance_is_refused(tmp_path):
    path = fx.write_bench(tmp_path, CELL, "tuned", _points())
    _rewrite(path, lambda d: d.pop("image_digest"))
    assert "image_digest = (absent): schema: a required field" in _refused(path)
    _rewrite(path, lambda d: d.update(image_digest="", schema_version=1))
    assert 'image_digest = "": the digest' in _refused(path)
    _rewrite(path, lambda d: d.update(image_digest=fx.DIGEST, schema_version=2))
    assert "schema_version = 2" in _refused(path)


def test_gsm8k_score_that_contradicts_its_samples_is_refused(tmp_path):
    res = tmp_path / "results"
    path = fx.write_gsm8k(res, CELL, "tuned", [True, False, False, False])
    _rewrite(path, lambda d: d.update(strict_match=0.875))
    message = _refused(path, res)
    assert "strict_match = 0.875" in message and "(1 of 4 = 0.25)" in message
    _rewrite(path, lambda d: d.update(strict_match=0.25, flexible_extract=0.5))
    assert "flexible_extract = 0.5" in _refused(path, res)
    _rewrite(path, lambda d: d.update(flexible_extract=0.25, n_samples=5))
    assert "n_samples = 5: the number of per_sample entries (4)" in _refused(path, res)


@pytest.mark.parametrize(
    ("size", "length"),
    [("whole", 0), ("half", None), ("empty", 0)],
)
def test_truncated_json_is_refused_without_a_traceback(tmp_path, size, length):
    path = fx.write_gsm8k(tmp_path, CELL, "tuned", [True, False])
    text = path.read_text()
    cut = text[: len(text) // 2] if size == "half" else ""
    if size == "whole":
        cut = text.rstrip("}\n")
    path.write_text(cut)
    atomicio.checksum_path(path).unlink()  # as a stage killed before it recorded one would
    message = _refused(path)
    assert "(whole file)" in message and "truncated or corrupt" in message


def test_a_file_changed_after_it_was_written_is_refused_by_its_checksum(tmp_path):
    path = fx.write_bench(tmp_path, CELL, "tuned", _points())
    # A plausible edit (schema-valid, invariants kept): only the checksum can tell.
    _rewrite(path, lambda d: d["points"][0].update(mean_ttft_ms=1.0), checksum=False)
    message = _refused(path)
    assert "changed after it was written" in message and "bench.json.sha256" in message
    # Deleting the sidecar does not switch the check off: the file is refused just the same.
    atomicio.checksum_path(path).unlink()
    message = _refused(path)
    assert "(sha256) = (no checksum recorded)" in message and "bench.json.sha256" in message


def test_missing_file_is_refused(tmp_path):
    assert "(file) = (absent)" in _refused(tmp_path / CELL / "gsm8k" / "tuned.json")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update({"0": d["1"]}), "['0'] = \"0\": a batch size: a positive integer"),
        (lambda d: d.update({"-4": d["1"]}), "['-4'] = \"-4\": a batch size"),
        (lambda d: d.update({"big": d["1"]}), "['big'] = \"big\": a batch size"),
        (lambda d: d["1"].update(BLOCK_SIZE_M=0), "['1'].BLOCK_SIZE_M = 0: a positive integer"),
        (lambda d: d["4"].update(num_warps="4"), "['4'].num_warps = \"4\": a positive integer"),
        (lambda d: d["4"].update(num_stages=2.0), "['4'].num_stages = 2.0: a positive integer"),
        (lambda d: d["1"].pop("GROUP_SIZE_M"), "['1'].GROUP_SIZE_M = (absent)"),
        (lambda d: d["1"].update(BLOCK_SIZE=16), "['1'].BLOCK_SIZE = 16: no such key"),
        (lambda d: d["1"].update(kpack=-1), "['1'].kpack = -1: a non-negative integer"),
        (lambda d: d.update({"16": d["1"]}), "(batch sizes) = [1, 4, 16]: the batch sizes of"),
        (lambda d: d["4"].update(BLOCK_SIZE_K=128), "['4'] = "),
    ],
)
def test_bad_tuned_configs_are_refused(tmp_path, edit, expected):
    res = tmp_path / "results"
    summary = fx.write_tune(res, CELL)
    config = summary.parent / "configs" / fx.CONFIG_FILE
    _rewrite(config, edit)
    message = _refused(summary, res)
    assert f"bad result file {config}: {expected}" in message
    # The configs come from the tune job: the hint forces it by its summary.
    assert f"--forcerun {summary}" in message


def test_bad_tune_summaries_are_refused(tmp_path):
    summary = fx.write_tune(tmp_path, CELL)
    _rewrite(summary, lambda d: d["entries"]["1"]["config"].update(BLOCK_SIZE_N=-64))
    assert "entries.1.config.BLOCK_SIZE_N = -64" in _refused(summary)
    _rewrite(summary, lambda d: d["entries"]["1"]["config"].update(BLOCK_SIZE_N=64))
    _rewrite(summary, lambda d: d.update(skipped_batch_sizes=[16]))
    assert "batch_sizes = [1, 4]: the batch sizes picked (entries) plus those skipped" in (
        _refused(summary)
    )
    _rewrite(summary, lambda d: d.update(skipped_batch_sizes=[], triton_version=""))
    assert 'triton_version = ""' in _refused(summary)


def test_comparison_points_are_checked(tmp_path):
    res = tmp_path / "results"
    comparison = "imgA-vs-imgB/m/tp1-ep1"
    side = {
        "cell": "imgA/m/tp1-ep1",
        "image_digest": fx.DIGEST,
        "cold": False,
        "tuned_config_dir": "x",
        "tuned_config_applied": True,
        "ignore_eos": True,
        "server": {"launcher": "docker", "model": "m", "model_id": "m", "ready_s": 1.0},
        "server_log": "server-imgA.log",
    }
    data = {
        "schema_version": 1,
        "kind": "image_comparison",
        "comparison": comparison,
        "images": ["imgA", "imgB"],
        "arm": "tuned",
        "runtime": "docker",
        "same_environment": False,
        "interleaved": True,
        "side_order": [["imgA", "imgB"]],
        "sides": {"imgA": side, "imgB": {**side, "cell": "imgB/m/tp1-ep1"}},
        "points": [fx.point(seq=0, image="imgA"), fx.point(seq=1, image="imgB")],
    }
    path = res / "compare" / comparison / "bench.json"
    atomicio.write_json(path, data, checksum=True)
    assert loaders.load(path, res).kind == result_file.COMPARISON
    _rewrite(path, lambda d: d["points"][1].update(failed=3))
    assert "points[1].completed = 160" in _refused(path, res)
    _rewrite(path, lambda d: d["points"][1].update(failed=0, p99_e2el_ms=-1))
    assert "points[1].p99_e2el_ms = -1" in _refused(path, res)
    _rewrite(path, lambda d: d["points"][1].update(p99_e2el_ms=1e9, image="imgC"))
    assert 'points[1].image = "imgC"' in _refused(path, res)


def test_report_cli_refuses_a_bad_file_and_keeps_the_previous_report(tmp_path):
    res = tmp_path / "results"
    files = _cell(res)
    out = tmp_path / "report"
    assert report.main(["--results", str(res), "--out-dir", str(out), *map(str, files)]) == 0
    before = (out / "report.md").read_text()
    index = json.loads((out / "INDEX.json").read_text())
    tables = {"report.md", "serve.csv", "gsm8k.csv", "tune.csv", "tidy.csv", "tidy.parquet"}
    assert set(index["files"]) == tables | {"pr/qwen3-30b-a3b-fp8.md"}
    assert {i["checksum"] for i in index["inputs"]} == {result_file.VERIFIED}
    bad = res / CELL / "serve/tuned/bench.json"
    bad.write_text(bad.read_text()[:100])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cellbench.report.build",
            "--results",
            str(res),
            "--out-dir",
            str(out),
        ]
        + [str(f) for f in files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"bad result file {bad}: (sha256)" in proc.stderr
    assert "changed after it was written" in proc.stderr
    assert f"the previous report was kept: {out / 'report.md'}" in proc.stderr
    assert (out / "report.md").read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report")] == []


def test_failed_archive_keeps_the_previous_archive(tmp_path, capsys):
    res = tmp_path / "results"
    _cell(res)
    root = res / "archive"
    args = ["build", "--label", "rocm7.2", "--results", str(res), "--cells", CELL]
    args += ["--digests", f"rocm7.2={fx.DIGEST}", "--config-hash", "f00"]
    args += ["--archive-root", str(root)]
    assert archive.main(args) == 0
    label = root / "rocm7.2"
    (run,) = [p for p in label.iterdir() if p.is_dir() and not p.is_symlink()]
    manifest = (run / "MANIFEST.json").read_text()
    assert archived.verify(run / "MANIFEST.json") == []
    bad = res / CELL / "gsm8k" / "untuned.json"
    _rewrite(bad, lambda d: d.update(strict_match=0.875))
    capsys.readouterr()
    assert archive.main(args) == 1
    err = capsys.readouterr().err
    # Named by its place in results/, not by the archive's temporary copy.
    assert f"bad result file {bad}: strict_match = 0.875" in err
    assert f"no run was added; {label} keeps its earlier runs (1) as they were" in err
    assert (run / "MANIFEST.json").read_text() == manifest
    assert archived.verify(run / "MANIFEST.json") == []
    # The run, its latest link and the first job's receipt; no temporary folder left.
    assert sorted(p.name for p in label.iterdir()) == sorted(["ARCHIVED.json", "latest", run.name])


@pytest.mark.slow
def test_report_rule_failure_keeps_the_old_report(tmp_path):
    """Real Snakemake, the report rule and its gates alone (--allowed-rules: the cells' files
    are the hand-made ones below, not jobs to run): a corrupted input fails the second run, the
    terminal names the file, and report.md from the first run is still there."""
    work = fresh_copy(tmp_path)
    res = work / "results"
    for model in ("tiny-qwen3-moe", "tiny-qwen3-moe-16e"):  # config/local.yaml's two cells
        _cell(res, f"host-cpu/{model}/tp1-ep1")

    def snakemake(*rules: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            # The gate and plots jobs run for real on the hand-made results.
            [sys.executable, "-m", "snakemake", "--cores", "1", "--allowed-rules", "report"]
            + list(rules or ("gate", "plots"))
            + ["--", "results/report/embedded-cpu/INDEX.json"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = snakemake()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = (res / "report/embedded-cpu/report.md").read_text()
    assert "## host-cpu/tiny-qwen3-moe-16e/tp1-ep1" in before
    figure = res / "report/embedded-cpu/plots/host-cpu/tiny-qwen3-moe-16e/tp1-ep1/latency.png"
    drawn = figure.read_bytes()
    # A gate verdict that does not follow from its checks: read by the report alone (a bad
    # measurement would stop the cell's plots job first, before the report runs).
    bad = res / "host-cpu/tiny-qwen3-moe-16e/tp1-ep1/gate.json"
    _rewrite(bad, lambda d: d.update(passed=not d["passed"]))
    # Not the gate job: allowed, it would rewrite the damaged verdict (test_missing_results).
    second = snakemake("plots")
    terminal = second.stdout + second.stderr
    assert second.returncode != 0
    assert f"bad result file {bad.relative_to(work)}: passed = " in terminal
    assert "the previous report was kept" in terminal
    assert (res / "report/embedded-cpu/report.md").read_text() == before
    assert figure.read_bytes() == drawn  # the figures it links are still there
    # Snakemake removed the stamp, so the next run redoes the report.
    assert not (res / "report/embedded-cpu/INDEX.json").exists()
