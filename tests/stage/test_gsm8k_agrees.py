"""The GSM8K summary is computed from lm-eval's per-sample records, and lm-eval's own aggregate
is checked against them: a summary can no longer contradict its samples (issue 30, item 4).

The lm-eval output is a real lm-eval run (the fixture of tests/stage/test_gsm8k.py: the timed server
answering every question with one known text); the fault is caused by editing its results
file, as a stray edit or a mixed-up copy would.
"""

from __future__ import annotations

import json
import shutil

import pytest
from cellbench.common import atomicio
from cellbench.gsm8k import evaluate as gsm8k
from support.gsm8k_run import N_QUESTIONS


def _summarize(lm_eval_dir, out) -> int:
    return gsm8k.main(["summarize", "--lm-eval-dir", str(lm_eval_dir), "--cell-id",
                       "c/m/tp1-ep1", "--arm", "tuned", "--out", str(out)])  # fmt: skip


@pytest.mark.slow
def test_scores_and_stderr_are_the_samples_own_and_match_lm_evals(lm_eval_run):  # noqa: F811
    _, out, expected = lm_eval_run
    summary = gsm8k.parse_results(out)
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"][gsm8k.TASK]
    assert summary["strict_match"] == sum(expected) / N_QUESTIONS
    # Our standard error from the samples is lm-eval's (sample std / sqrt(n)).
    assert summary["strict_match_stderr"] == pytest.approx(
        results["exact_match_stderr,strict-match"], abs=1e-12
    )
    assert gsm8k.sample_score([True, False, True, True]) == pytest.approx((0.75, 0.25))


@pytest.mark.slow
def test_an_edited_lm_eval_aggregate_is_refused_naming_both_numbers(
    lm_eval_run,  # noqa: F811
    tmp_path,
    capsys,
):
    _, out, expected = lm_eval_run
    copy = tmp_path / "lm_eval"
    shutil.copytree(out, copy)
    results_file = next(copy.rglob("results_*.json"))
    data = json.loads(results_file.read_text())
    wrong = 0.875 if sum(expected) / N_QUESTIONS != 0.875 else 0.5
    data["results"][gsm8k.TASK]["exact_match,strict-match"] = wrong
    results_file.write_text(json.dumps(data))
    # Recorded after the edit, as if lm-eval had written it so: the clash itself is refused.
    atomicio.write_tree_checksum(copy)
    dest = tmp_path / "gsm8k" / "tuned.json"
    assert _summarize(copy, dest) == 1
    err = capsys.readouterr().err
    assert f"exact_match,strict-match = {wrong}" in err
    assert f"has {sum(expected)} of {N_QUESTIONS} correct" in err
    # The fix reruns lm-eval (the serve job), not the summary that would repeat the clash.
    assert f"--forcerun {tmp_path}/bench.json" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not dest.exists() and not dest.parent.exists()


def test_an_lm_eval_folder_edited_after_the_serve_job_is_refused(tmp_path, capsys):
    """lm-eval's folder is a result too: an edit after the serve job recorded it (or its
    checksum deleted) is refused before anything is read, naming the file and the job."""
    folder = tmp_path / "lm_eval"
    (folder / "instance-1").mkdir(parents=True)
    results = folder / "instance-1" / "results_2026-12-05T10-00-00.json"
    results.write_text('{"results": {}}')
    atomicio.write_tree_checksum(folder)
    results.write_text('{"results": {"x": 1}}')
    assert _summarize(folder, tmp_path / "out.json") == 1
    err = capsys.readouterr().err
    assert "instance-1/results_2026-12-05T10-00-00.json changed after it was written" in err
    assert f"--forcerun {folder}" in err and not (tmp_path / "out.json").exists()
    atomicio.tree_checksum_path(folder).unlink()
    assert _summarize(folder, tmp_path / "out.json") == 1
    assert "no checksum recorded (lm_eval.sha256 is missing)" in capsys.readouterr().err


def test_unreadable_lm_eval_output_is_one_line(tmp_path, capsys):
    (tmp_path / "lm_eval").mkdir()
    (tmp_path / "lm_eval" / "results_2026-12-05T10-00-00.json").write_text("{not json")
    atomicio.write_tree_checksum(tmp_path / "lm_eval")  # as the serve job records what it got
    assert _summarize(tmp_path / "lm_eval", tmp_path / "out.json") == 1
    err = capsys.readouterr().err
    assert err.startswith("cellbench gsm8k: error: ") and "Traceback" not in err
    assert "results_2026-12-05T10-00-00.json: lm-eval's results file is not whole JSON" in err
    assert len(err.strip().splitlines()) == 1
