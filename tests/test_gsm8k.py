"""GSM8K: real lm-eval 0.4.13 runs on the local task, and parse_results on its real output.

The server here is the timed server answering every question with one fixed text, so the right
answer is known per question: only questions whose answer is that number score.
"""

from __future__ import annotations

import json

import pytest
from cellbench import assets, gsm8k
from cellbench.testing.timed_server import launch

N_QUESTIONS = 6


@pytest.fixture(scope="module")
def lm_eval_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsm8k")
    task_dir = assets.make_gsm8k_set(root / "task", N_QUESTIONS, seed=0, n_train=4)
    test = [json.loads(x) for x in (task_dir / assets.GSM8K_TEST_FILE).read_text().splitlines()]
    answer = test[0]["answer"].split("#### ")[-1]
    # A reply that is right (strict and flexible) for every question whose answer is `answer`.
    text = f" The total is {answer}.\n#### {answer}\n\nQuestion: ignored"
    with launch("--ttft-ms", "1", "--itl-ms", "0", "--completion-text", text) as (base, _):
        out = root / "lm_eval"
        gsm8k.run_lm_eval(
            base,
            "timed-model",
            out,
            root / "lm_eval.log",
            task_dir=task_dir,
            num_fewshot=2,
            limit=N_QUESTIONS,
            timeout_s=300,
        )
    expected = [t["answer"].split("#### ")[-1] == answer for t in test]
    return root, out, expected


@pytest.mark.slow
def test_parse_real_lm_eval_output(lm_eval_run):
    _, out, expected = lm_eval_run
    s = gsm8k.parse_results(out, cell="host-cpu/tiny/tp1-ep1", arm="untuned")
    gsm8k.validate(s)
    assert s["task"] == "gsm8k_local" and s["num_fewshot"] == 2
    assert s["n_samples"] == N_QUESTIONS == len(s["per_sample"])
    assert [p["doc_id"] for p in s["per_sample"]] == list(range(N_QUESTIONS))
    assert [p["strict"] for p in s["per_sample"]] == expected
    assert [p["flexible"] for p in s["per_sample"]] == expected
    assert s["strict_match"] == pytest.approx(sum(expected) / N_QUESTIONS)
    assert s["flexible_extract"] == pytest.approx(sum(expected) / N_QUESTIONS)
    assert s["strict_match_stderr"] is not None and s["strict_match_stderr"] >= 0


@pytest.mark.slow
def test_summarize_cli_writes_valid_file(lm_eval_run, tmp_path, capsys):
    _, out, expected = lm_eval_run
    dest = tmp_path / "gsm8k" / "untuned.json"
    rc = gsm8k.main(
        [
            "summarize",
            "--lm-eval-dir",
            str(out),
            "--cell-id",
            "c/m/tp1-ep1",
            "--arm",
            "untuned",
            "--out",
            str(dest),
        ]
    )
    assert rc == 0
    data = json.loads(dest.read_text())
    assert data["cell"] == "c/m/tp1-ep1" and data["n_samples"] == N_QUESTIONS
    assert sum(p["strict"] for p in data["per_sample"]) == sum(expected)
    assert "strict" in capsys.readouterr().out


@pytest.mark.slow
def test_missing_samples_is_a_clear_error(lm_eval_run, tmp_path):
    import shutil

    _, out, _ = lm_eval_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for f in copy.rglob("samples_*.jsonl"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="log_samples"):
        gsm8k.parse_results(copy)


def test_no_results_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="results_"):
        gsm8k.parse_results(tmp_path)


def test_command_line_shape(tmp_path):
    cmd = gsm8k.lm_eval_command(
        "http://127.0.0.1:8100/",
        "tiny",
        tmp_path / "o",
        task_dir=tmp_path,
        num_fewshot=5,
        limit=7,
    )
    joined = " ".join(cmd)
    assert "--model local-completions" in joined
    assert "base_url=http://127.0.0.1:8100/v1/completions" in joined
    assert "tokenizer_backend=None" in joined and "tokenized_requests=False" in joined
    assert "--tasks gsm8k_local" in joined and f"--include_path {tmp_path}" in joined
    assert "--num_fewshot 5" in joined and "--limit 7" in joined and "--log_samples" in cmd
    builtin = gsm8k.lm_eval_command(
        "http://h:1", "m", tmp_path, task_dir=None, num_fewshot=5, limit=None
    )
    assert "gsm8k" in builtin and "--include_path" not in builtin and "--limit" not in builtin


def test_run_rejects_task_dir_without_yaml(tmp_path):
    with pytest.raises(ValueError, match="gsm8k_local.yaml"):
        gsm8k.run_lm_eval(
            "http://127.0.0.1:9",
            "m",
            tmp_path / "o",
            tmp_path / "l",
            task_dir=tmp_path,
            num_fewshot=1,
        )
