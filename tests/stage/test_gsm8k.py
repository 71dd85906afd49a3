"""GSM8K: real lm-eval 0.4.13 runs of the project's task, and parse_results on their output.

The server here is the timed server answering every question with one fixed text, so the right
answer is known per question: only questions whose answer is that number score. It answers
both /v1/completions and /v1/chat/completions; which one lm-eval uses is chosen from real
tokenizer folders (the embedded default's tokenizer, saved with and without its chat template).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import requests
import yaml
from cellbench.assets import build as assets
from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.gsm8k import evaluate as gsm8k
from cellbench.results import loaders
from cellbench.serve import stage as serve_stage
from cellbench.serve.timed_server import launch
from support.gsm8k_run import N_QUESTIONS


@pytest.mark.slow
def test_parse_real_lm_eval_output(lm_eval_run):
    _, out, expected = lm_eval_run
    s = gsm8k.parse_results(out, cell="host-cpu/tiny/tp1-ep1", arm="untuned")
    result_file.check_gsm8k(s, out / "untuned.json")
    assert s["task"] == gsm8k.TASK and s["num_fewshot"] == 2
    assert s["api"] == "completions" and s["lm_eval_model"] == "local-completions"
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
    atomicio.write_tree_checksum(out)  # as the serve job records lm-eval's folder
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
        api="completions",
        num_fewshot=5,
        limit=7,
    )
    joined = " ".join(cmd)
    assert "--model local-completions" in joined
    assert "base_url=http://127.0.0.1:8100/v1/completions" in joined
    assert "tokenizer_backend=None" in joined and "tokenized_requests=False" in joined
    assert f"--tasks {gsm8k.TASK}" in joined and f"--include_path {tmp_path}" in joined
    assert "--num_fewshot 5" in joined and "--limit 7" in joined and "--log_samples" in cmd
    assert "--apply_chat_template" not in cmd
    chat = gsm8k.lm_eval_command(
        "http://h:1", "m", tmp_path, task_dir=tmp_path, api="chat", num_fewshot=5, limit=None
    )
    joined = " ".join(chat)
    assert "--model local-chat-completions" in joined
    assert "base_url=http://h:1/v1/chat/completions" in joined
    assert "--apply_chat_template" in chat and "--fewshot_as_multiturn true" in joined
    assert "--log_samples" in chat and "--limit" not in chat
    with pytest.raises(ValueError, match="chat or completions"):
        gsm8k.lm_eval_command(
            "http://h:1", "m", tmp_path, task_dir=tmp_path, api="auto", num_fewshot=5, limit=None
        )


def test_run_rejects_a_missing_dataset(tmp_path):
    with pytest.raises(ValueError, match="no such JSONL file"):
        gsm8k.run_lm_eval(
            "http://127.0.0.1:9",
            "m",
            tmp_path / "o",
            tmp_path / "l",
            dataset=str(tmp_path / "missing.jsonl"),
            num_fewshot=1,
        )
    assert not (tmp_path / "l").exists()


def test_project_task_scores_like_published_gsm8k(tmp_path):
    """The project's task has GSM8K's prompt, stop strings, normalisation and both extraction
    filters (lm-eval's own gsm8k.yaml holds the published ones); the dataset is the run's."""
    import lm_eval

    theirs = yaml.safe_load(
        (Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text()
    )
    data = assets.make_gsm8k_set(tmp_path / "set", 3, seed=0, n_train=1) / assets.GSM8K_TEST_FILE
    local = yaml.safe_load(gsm8k.write_task(str(data), tmp_path / "local").read_text())
    hub = yaml.safe_load(gsm8k.write_task("openai/gsm8k", tmp_path / "hub").read_text())
    for key in (
        "output_type",
        "doc_to_text",
        "doc_to_target",
        "metric_list",
        "generation_kwargs",
        "filter_list",
        "num_fewshot",
        "repeats",
    ):
        assert local[key] == theirs[key] == hub[key], key
    assert local["task"] == hub["task"] == gsm8k.TASK
    assert local["dataset_path"] == "json"
    assert Path(local["dataset_kwargs"]["data_files"]["test"]) == data.resolve()
    assert local["test_split"] == local["fewshot_split"] == "test"
    for key in ("dataset_path", "dataset_name", "test_split", "training_split", "fewshot_split"):
        assert hub[key] == theirs[key], key
    with pytest.raises(ValueError, match="neither a hub id"):
        gsm8k.write_task("not a dataset", tmp_path / "bad")


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory):
    """The embedded default's real tokenizer saved twice: as built (ChatML template) and with
    its template removed (as a base model's tokenizer comes)."""
    root = tmp_path_factory.mktemp("tok")
    tok = assets.train_tokenizer(300, seed=0)
    tok.save_pretrained(root / "chat")
    tok.chat_template = None
    tok.save_pretrained(root / "base")
    return root / "chat", root / "base"


def test_api_follows_the_models_chat_template(tokenizer_folders, tmp_path):
    chat, base = tokenizer_folders
    api, why = gsm8k.choose_api("auto", str(chat))
    assert api == "chat" and str(chat.resolve()) in why
    path, _ = gsm8k.chat_template_source(str(chat))
    assert path is not None and "<|im_start|>" in path.read_text()
    api, why = gsm8k.choose_api("auto", str(base))
    assert api == "completions" and why.startswith("no chat template in")
    # Not observable: said so, and completions.
    api, why = gsm8k.choose_api("auto", str(tmp_path))
    assert api == "completions" and why.startswith("not observed")
    api, why = gsm8k.choose_api("auto", "timed-model")
    assert api == "completions" and why.startswith("not observed")
    # A configured api wins, and what was observed is still recorded.
    api, why = gsm8k.choose_api("completions", str(chat))
    assert api == "completions" and "chat template in" in why
    with pytest.raises(ValueError, match="auto, chat, completions"):
        gsm8k.choose_api("both", str(chat))


def test_api_of_a_hub_model_from_the_hf_cache(tokenizer_folders, tmp_path):
    """A hub id is looked up offline in the cache a server filled, laid out as
    huggingface_hub writes it (models--OWNER--NAME/refs/main -> snapshots/REV/FILE)."""
    chat, base = tokenizer_folders
    for name, folder in (("chat-model", chat), ("base-model", base)):
        repo = tmp_path / "hf" / "hub" / f"models--org--{name}"
        snap = repo / "snapshots" / "0123abc"
        snap.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0123abc")
        for f in folder.iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
    api, why = gsm8k.choose_api("auto", "org/chat-model", tmp_path / "hf")
    assert api == "chat" and "snapshots/0123abc/chat_template.jinja" in why
    api, why = gsm8k.choose_api("auto", "org/base-model", tmp_path / "hf")
    assert api == "completions" and why.startswith("no chat template in")
    api, why = gsm8k.choose_api("auto", "org/never-served", tmp_path / "hf")
    assert api == "completions" and why.startswith("not observed")


def _questions(dataset: Path) -> list[dict]:
    return [json.loads(x) for x in dataset.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_chat_run_with_multiturn_fewshot_and_doc_keys(tokenizer_folders, tmp_path):
    """Real lm-eval, chat API chosen from the ChatML tokenizer, against the timed server's
    chat route; a second, shorter run on reordered questions pairs with it by doc_key."""
    chat, _ = tokenizer_folders
    task = assets.make_gsm8k_set(tmp_path / "set", N_QUESTIONS, seed=3, n_train=2)
    dataset = task / assets.GSM8K_TEST_FILE
    test = _questions(dataset)
    answer = test[0]["answer"].split("#### ")[-1]
    text = f" So {answer}.\n#### {answer}"
    api, source = gsm8k.choose_api("auto", str(chat))
    reordered = tmp_path / "reordered.jsonl"
    reordered.write_text("".join(json.dumps(r) + "\n" for r in reversed(test)))
    with launch("--ttft-ms", "1", "--itl-ms", "0", "--completion-text", text) as (base, _):
        for name, data, limit in (("a", dataset, None), ("b", reordered, 3)):
            gsm8k.run_lm_eval(
                base,
                "timed-model",
                tmp_path / name,
                tmp_path / f"{name}.log",
                dataset=str(data),
                api=api,
                chat_template_source=source,
                num_fewshot=2,
                limit=limit,
                timeout_s=300,
            )
        n_chat = requests.get(f"{base}/stats", timeout=5).json()["n_chat"]
    assert n_chat == N_QUESTIONS + 3  # every question went to the chat route
    a = gsm8k.parse_results(tmp_path / "a", cell="c/m/tp1-ep1", arm="tuned")
    result_file.check_gsm8k(a, tmp_path / "tuned.json")
    assert a["api"] == "chat" and a["lm_eval_model"] == "local-chat-completions"
    assert a["chat_template_source"] == source and a["dataset"] == str(dataset)
    expected = {
        hashlib.sha256(t["question"].encode()).hexdigest()[:16]: t["answer"].endswith(
            f"#### {answer}"
        )
        for t in test
    }
    assert {r["doc_key"]: r["strict"] for r in a["per_sample"]} == expected
    # Few-shot examples went as earlier user/assistant turns, never the question under test.
    sample = json.loads(next((tmp_path / "a").rglob("samples_*.jsonl")).read_text().splitlines()[0])
    messages = json.loads(sample["arguments"]["gen_args_0"]["arg_0"][0])
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    assert sample["doc"]["question"] in messages[-1]["content"]
    assert all(sample["doc"]["question"] not in m["content"] for m in messages[:-1])
    # The other run saw the last 3 questions first, with other doc_ids: doc_key pairs them.
    b = gsm8k.parse_results(tmp_path / "b")
    assert [r["doc_id"] for r in b["per_sample"]] == [0, 1, 2]
    a_by_key = {r["doc_key"]: r for r in a["per_sample"]}
    for row in b["per_sample"]:
        assert a_by_key[row["doc_key"]]["strict"] == row["strict"]
        assert a_by_key[row["doc_key"]]["doc_id"] == N_QUESTIONS - 1 - row["doc_id"]


@pytest.mark.slow
def test_instances_run_on_fresh_server_starts(tmp_path):
    """gsm8k.instances = 2 on one arm: the stage stops its (timed) server after the first
    lm-eval run, starts it again, waits for it and runs lm-eval again."""
    task = assets.make_gsm8k_set(tmp_path / "set", 4, seed=0, n_train=2)
    dataset = task / assets.GSM8K_TEST_FILE
    answer = _questions(dataset)[0]["answer"].split("#### ")[-1]
    server = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
    # 1 ms per token: a stream faster than serve.min_plausible_tpot_ms would be invalid.
    server += ["--ttft-ms", "1", "--itl-ms", "1", "--completion-text", f"#### {answer}"]
    out = tmp_path / "out"
    args = ["--runtime", "local", "--cell-id", "host-cpu/tiny/tp1-ep1", "--arm", "untuned"]
    args += ["--tp", "1", "--ep", "1", "--lease-dir", str(tmp_path / "leases")]
    args += ["--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)]
    args += ["--model", "timed-model", "--server-command-json", json.dumps(server)]
    args += ["--grid-json", '[{"isl": 8, "osl": 4}]', "--concurrency", "1"]
    args += ["--prompts-per-concurrency", "2", "--warmups-per-concurrency", "0"]
    args += ["--gsm8k-dataset", str(dataset), "--gsm8k-fewshot", "1"]
    args += ["--gsm8k-instances", "2", "--gsm8k-api", "auto"]
    assert serve_stage.main(args) == 0
    log = (out / "server.log").read_text()
    # Two starts of the server, each its own process, in one appended log.
    assert log.count("# cellbench: ") == 2 and log.count("timed_server: starting on") == 2
    assert [d.name for d in gsm8k.instance_dirs(out / "lm_eval")] == ["instance-1", "instance-2"]
    bench = json.loads((out / "bench.json").read_text())
    assert bench["gsm8k"]["instances"] == 2 and bench["gsm8k"]["dataset"] == str(dataset)
    dest = tmp_path / "res" / "host-cpu" / "tiny" / "tp1-ep1" / "gsm8k" / "untuned.json"
    cli = ["summarize", "--lm-eval-dir", str(out / "lm_eval"), "--cell-id"]
    assert gsm8k.main([*cli, "host-cpu/tiny/tp1-ep1", "--arm", "untuned", "--out", str(dest)]) == 0
    loaded = loaders.load_gsm8k(dest, tmp_path / "res").data
    assert [i["instance"] for i in loaded["instances"]] == [1, 2]
    assert loaded["api"] == "completions" and "not observed" in loaded["chat_template_source"]
    first = loaded["instances"][0]
    assert loaded["strict_match"] == first["strict_match"] == loaded["instances"][1]["strict_match"]
    assert [r["doc_key"] for r in first["per_sample"]] == [
        r["doc_key"] for r in loaded["per_sample"]
    ]
    lines = gsm8k.instance_spread_lines({"untuned": loaded["instances"]})
    assert "range 0.00 points" in lines[2] and "answer 0 of 4 questions differently" in lines[2]


def test_instance_spread_on_constructed_starts():
    def start(k, right):
        rows = [
            {"doc_id": i, "doc_key": f"{i:016x}", "strict": r, "flexible": r}
            for i, r in enumerate(right)
        ]
        share = sum(right) / len(right)
        return {
            "instance": k,
            "strict_match": share,
            "flexible_extract": share,
            "n_samples": len(rows),
            "per_sample": rows,
        }

    # Same score, different questions: the scores alone would hide it, the pairing does not.
    a = start(1, [True, True, False, False])
    b = start(2, [False, False, True, True])
    c = start(3, [True, True, True, False])
    spread = gsm8k.instance_spread([a, b, c])
    assert spread["min"] == 0.5 and spread["max"] == 0.75 and spread["range"] == 0.25
    assert [(p["instances"], p["differ"], p["n"]) for p in spread["pairs"]] == [
        ((1, 2), 4, 4),
        ((1, 3), 1, 4),
        ((2, 3), 3, 4),
    ]
    lines = gsm8k.instance_spread_lines({"untuned": [a, b, c], "tuned": [start(1, [True] * 4)]})
    assert len(lines) == 4
    assert "range 25.00 points" in lines[2] and "starts 1 and 2 answer 4 of 4" in lines[2]
    assert "+50.00 points" in lines[3] and "25.00 points" in lines[3]
    assert gsm8k.instance_spread_lines({"untuned": [a], "tuned": []}) == []
