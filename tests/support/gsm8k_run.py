"""One real lm-eval GSM8K run against a local server, shared by the GSM8K tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cellbench.assets import build as assets
from cellbench.gsm8k import evaluate as gsm8k
from cellbench.serve.timed_server import launch

N_QUESTIONS = 6


@pytest.fixture(scope="module")
def lm_eval_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gsm8k")
    task_dir = assets.make_gsm8k_set(root / "task", N_QUESTIONS, seed=0, n_train=4)
    dataset = str(task_dir / assets.GSM8K_TEST_FILE)
    test = [json.loads(x) for x in Path(dataset).read_text().splitlines()]
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
            dataset=dataset,
            num_fewshot=2,
            limit=N_QUESTIONS,
            timeout_s=300,
        )
    expected = [t["answer"].split("#### ")[-1] == answer for t in test]
    return root, out, expected
