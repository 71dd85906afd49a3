"""GSM8K gates (issue 20 item 4): a cell below its floor, or a tuned arm that loses questions
beyond noise, is marked failed and fails the run with a message naming model, arm, metric,
value and gate; nothing else of the run is lost. Results are real files written through the
project's writers (tests/support/result_fixtures.py); the CLI is the one the rules call."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cellbench.contracts.result_file import ResultError
from cellbench.gates import check as gates
from cellbench.results.loaders import load as load_result
from support.result_fixtures import write_gsm8k

CELL = "rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2"
N = 400


def answers(right: int, n: int = N) -> list[bool]:
    return [i < right for i in range(n)]


def _write_arms(results, untuned: list[bool], tuned: list[bool]):
    return (
        write_gsm8k(results, CELL, "untuned", untuned),
        write_gsm8k(results, CELL, "tuned", tuned),
    )


def _evaluate(results, gate, untuned_path, tuned_path):
    out = results / CELL / "gate.json"
    argv = [
        "evaluate",
        "--cell",
        CELL,
        "--model",
        "qwen3-30b-a3b-fp8",
        "--gate",
        json.dumps(gate),
        "--untuned",
        str(untuned_path),
        "--tuned",
        str(tuned_path),
        "--out",
        str(out),
    ]
    assert gates.main(argv) == 0
    return out


def test_floor_names_model_arm_metric_value_and_gate(tmp_path, capsys):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(340), answers(300))  # 0.85 and 0.75
    out = _evaluate(res, {"floor": 0.80, "metric": "strict_match"}, u, t)
    gate = load_result(out, res).data  # the loader accepts what evaluate wrote
    assert not gate["passed"]
    failed = [c for c in gate["checks"] if not c["passed"]]
    assert [(c["check"], c["arm"]) for c in failed] == [("floor", "tuned")]

    rc = gates.main(["check", "--results", str(res), "--out", str(tmp_path / "S.json"), str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "S.json").exists()
    line = next(x for x in err.splitlines() if "FAILED" in x)
    for part in ("qwen3-30b-a3b-fp8", "arm tuned", "strict_match", "0.7500", "floor 0.8000"):
        assert part in line, (part, line)


def test_continue_prints_the_failure_and_succeeds(tmp_path, capsys):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(300), answers(300))
    out = _evaluate(res, {"floor": 0.80}, u, t)
    summary = tmp_path / "S.json"
    argv = ["check", "--on-failure", "continue", "--results", str(res), "--out", str(summary)]
    rc = gates.main([*argv, str(out)])
    assert rc == 0
    assert len(json.loads(summary.read_text())["failed"]) == 2  # both arms below the floor
    assert capsys.readouterr().err.count("FAILED") == 2


def test_a_drop_beyond_noise_fails_and_a_drop_within_noise_does_not(tmp_path, capsys):
    res = tmp_path / "results"
    # 30 questions broken, none fixed: McNemar's mid-p is far below 0.05.
    u, t = _write_arms(res, answers(330), answers(300))
    gate = json.loads(_evaluate(res, {"max_drop": 0.02}, u, t).read_text())
    (check,) = gate["checks"]
    assert check["check"] == "max_drop" and check["broken"] == 30 and check["fixed"] == 0
    assert check["verdict"] == "worse" and not gate["passed"]
    assert check["value"] == pytest.approx(30 / N)

    # The same 1-point drop as 5 broken, 1 fixed: not beyond noise, so the gate holds even
    # with max_drop 0.
    untuned = answers(330)
    tuned = list(untuned)
    for i in range(5):
        tuned[i] = False
    tuned[N - 1] = True
    u, t = _write_arms(res, untuned, tuned)
    gate = json.loads(_evaluate(res, {"max_drop": 0.0}, u, t).read_text())
    (check,) = gate["checks"]
    assert (check["fixed"], check["broken"]) == (1, 5)
    assert check["verdict"] != "worse" and gate["passed"]


def test_no_gate_passes_with_no_checks(tmp_path):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(10), answers(0))
    gate = json.loads(_evaluate(res, None, u, t).read_text())
    assert gate["passed"] and gate["checks"] == []
    assert gates.report_lines(gate) == []


def test_report_lines_show_the_failure(tmp_path):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(340), answers(300))
    gate = json.loads(_evaluate(res, {"floor": 0.8}, u, t).read_text())
    text = "\n".join(gates.report_lines(gate))
    assert "GSM8K gate failed" in text and "0.7500" in text and "floor 0.8000" in text


def test_an_edited_gate_file_is_refused(tmp_path):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(300), answers(300))
    out = _evaluate(res, {"floor": 0.8}, u, t)
    data = json.loads(out.read_text())
    data["passed"] = True  # a failure edited into a pass
    out.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="sha256"):
        load_result(out, res)


def test_cli_runs_as_a_module(tmp_path):
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(300), answers(300))
    out = _evaluate(res, {"floor": 0.8}, u, t)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cellbench.gates.check",
            "check",
            "--out",
            str(tmp_path / "S"),
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "below the gate's floor" in r.stderr


def test_the_report_marks_a_failed_cell_and_keeps_its_numbers(tmp_path):
    from cellbench.report import build as report

    res = tmp_path / "results"
    u, t = _write_arms(res, answers(340), answers(300))
    gate = _evaluate(res, {"floor": 0.8}, u, t)
    out = report.write_report([u, t, gate], tmp_path / "report", results=res)
    text = out.read_text()
    assert "GSM8K gate failed (strict_match)" in text
    assert "arm tuned: strict_match = 0.7500" in text
    # The GSM8K numbers and the paired comparison are still there.
    assert "exact_match, strict-match" in text and "mid-p" in text


def test_the_same_results_and_gate_give_the_same_file(tmp_path):
    # No time stamp in the verdict: re-judging unchanged results archives nothing new.
    res = tmp_path / "results"
    u, t = _write_arms(res, answers(330), answers(300))
    first = _evaluate(res, {"max_drop": 0.02}, u, t).read_bytes()
    assert _evaluate(res, {"max_drop": 0.02}, u, t).read_bytes() == first
    assert json.loads(first)["checks"][0]["paired_by"] == "doc_id"  # fixtures carry no doc_key
