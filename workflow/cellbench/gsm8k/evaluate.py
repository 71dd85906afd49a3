"""GSM8K through lm-eval 0.4.13 against a running server, and its results in cellbench's schema.

The task is always the project's own (``data/gsm8k_task.yaml``, task ``gsm8k_cellbench``);
``write_task`` adds the dataset to it per run: the hub's ``openai/gsm8k`` (config ``main``,
test split, few-shot examples from train) or a local JSONL file of ``{question, answer}``
records (few-shot examples drawn from the file's other questions).

``run_lm_eval`` runs lm-eval's CLI as a subprocess (``--log_samples`` always) with either
``local-chat-completions`` against ``{base_url}/v1/chat/completions`` (``--apply_chat_template
--fewshot_as_multiturn``: each few-shot example is a user turn and an assistant turn) or
``local-completions`` against ``{base_url}/v1/completions`` (one plain-text prompt).
``choose_api`` picks one for ``auto`` from the served model's own tokenizer files: chat when
they carry a chat template. Each run folder gets ``cellbench_run.json`` saying which API ran
and why, and ``task/`` with the exact task file.

``parse_results`` reads lm-eval's ``results_*.json`` and ``samples_<task>_*.jsonl`` into::

    {cell, arm, task, num_fewshot, n_samples, strict_match, strict_match_stderr,
     flexible_extract, flexible_extract_stderr, lm_eval_model, api, chat_template_source,
     per_sample: [{doc_id, doc_key, strict, flexible, ...}], instances: [...]}

``doc_key`` is the first 16 hex characters of the sha256 of the question text, so two runs
pair by question even when their order or limit differ. A folder holding ``instance-K/``
sub-folders (``gsm8k.instances`` > 1: one lm-eval run per fresh server start) gives one
``instances`` entry per folder; the top-level scores are instance 1's.

CLI (the gsm8k rule)::

    python -m cellbench.gsm8k summarize --lm-eval-dir DIR --cell-id ID --arm ARM --out FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cellbench.common import paths
from cellbench.common.atomicio import tree_problem, write_json
from cellbench.contracts import result_file
from cellbench.contracts.gsm8k_dataset import HUB_ID, dataset_problem, is_local_dataset

TASK = "gsm8k_cellbench"
# Task names of outputs written before the project's own task (still parsed).
OLD_TASKS = ("gsm8k_local", "gsm8k")
TASK_FILE = paths.DATA_DIR / "gsm8k_task.yaml"
APIS = ("auto", "chat", "completions")
LM_EVAL_MODELS = {"chat": "local-chat-completions", "completions": "local-completions"}
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
RUN_INFO = "cellbench_run.json"
INSTANCE_PREFIX = "instance-"


class LmEvalError(RuntimeError):
    """lm-eval failed or left no results; the message carries its log tail."""


def doc_key(question: str) -> str:
    """A question's key for pairing runs: sha256 of its text, first 16 hex characters."""
    return hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


def write_task(dataset: str, dest_dir: Path) -> Path:
    """Write the project's task with ``dataset``'s fields into ``dest_dir`` (a folder for
    lm-eval's ``--include_path``); return the file."""
    import yaml

    problem = dataset_problem(dataset)
    if problem:
        raise ValueError(f"gsm8k dataset {problem}")
    task = yaml.safe_load(TASK_FILE.read_text())
    if is_local_dataset(dataset):
        test_file = str(Path(dataset).expanduser().resolve())
        # One file: the question under test is never among its own few-shot examples
        # (lm-eval leaves the evaluated document out when the two splits are the same).
        task.update(
            dataset_path="json",
            dataset_kwargs={"data_files": {"test": test_file}},
            test_split="test",
            fewshot_split="test",
        )
    else:
        task.update(
            dataset_path=dataset,
            dataset_name="main",
            test_split="test",
            training_split="train",
            fewshot_split="train",
        )
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"{TASK}.yaml"
    out.write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    return out


# --- which API the model needs ----------------------------------------------------------------

_TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")


def _template_in(path: Path) -> bool:
    """Whether one tokenizer file carries a non-empty chat template."""
    if path.suffix == ".jinja":
        return bool(path.read_text(errors="replace").strip())
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return bool(isinstance(data, dict) and data.get("chat_template"))


def chat_template_source(model: str, hf_cache: Path | None = None) -> tuple[Path | None, str]:
    """Find the served model's chat template in its own tokenizer files: a model folder read
    directly, a hub id through the Hugging Face cache the server filled (``hf_cache`` is an
    HF home, as mounted into containers; None = this host's default cache), offline.

    Returns ``(file, why)``: the file holding the template, or None with the reason none was
    found (no template, or the files could not be seen)."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        seen = [folder / name for name in _TEMPLATE_FILES if (folder / name).is_file()]
        for path in seen:
            if _template_in(path):
                return path.resolve(), f"chat template in {path.resolve()}"
        if not seen:
            return None, f"not observed: {folder} has none of {', '.join(_TEMPLATE_FILES)}"
        return None, f"no chat template in {', '.join(str(p) for p in seen)}"
    if not HUB_ID.match(model):
        return None, f"not observed: {model!r} is neither a folder nor a hub id"
    from huggingface_hub import constants, try_to_load_from_cache

    cache = Path(hf_cache).expanduser() / "hub" if hf_cache else Path(constants.HF_HUB_CACHE)
    seen = []
    for name in _TEMPLATE_FILES:
        hit = try_to_load_from_cache(model, name, cache_dir=cache)
        if isinstance(hit, str) and Path(hit).is_file():
            seen.append(Path(hit))
            if _template_in(Path(hit)):
                return Path(hit), f"chat template in {hit}"
    if not seen:
        return None, f"not observed: no tokenizer files of {model} in the cache {cache}"
    return None, f"no chat template in {', '.join(str(p) for p in seen)}"


def choose_api(requested: str, model: str, hf_cache: Path | None = None) -> tuple[str, str]:
    """``(api, chat_template_source)``: ``chat`` or ``completions``, and what was observed.
    ``auto`` is chat exactly when the model's files carry a chat template; when that cannot
    be observed the reason says so and completions is used."""
    if requested not in APIS:
        raise ValueError(f"gsm8k api must be one of {', '.join(APIS)}, got {requested!r}")
    path, why = chat_template_source(model, hf_cache)
    if requested != "auto":
        return requested, f"{why} (api {requested} as configured)"
    return ("chat" if path is not None else "completions"), why


# --- running lm-eval --------------------------------------------------------------------------


def lm_eval_command(
    base_url: str,
    model_id: str,
    output_path: Path,
    *,
    task_dir: Path,
    api: str = "completions",
    num_fewshot: int,
    limit: int | None,
    seed: int = 0,
    max_gen_toks: int = 256,
    num_concurrent: int = 1,
) -> list[str]:
    """The lm-eval command line for one GSM8K run of the task written into ``task_dir``."""
    if api not in LM_EVAL_MODELS:
        raise ValueError(f"api must be chat or completions here, got {api!r}")
    model_args = ",".join(
        [
            f"model={model_id}",
            f"base_url={base_url.rstrip('/')}{ENDPOINTS[api]}",
            # The server applies its own tokenizer (and, for chat, its own template).
            "tokenizer_backend=None",
            "tokenized_requests=False",
            # Requests in flight at once: a batching server answers them in shared steps.
            f"num_concurrent={num_concurrent}",
            "max_retries=3",
            f"max_gen_toks={max_gen_toks}",
        ]
    )
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", LM_EVAL_MODELS[api]]
    cmd += ["--model_args", model_args, "--tasks", TASK, "--num_fewshot", str(num_fewshot)]
    cmd += ["--batch_size", "1", "--output_path", str(output_path), "--log_samples"]
    cmd += ["--seed", str(seed), "--include_path", str(task_dir)]
    if api == "chat":
        cmd += ["--apply_chat_template", "--fewshot_as_multiturn", "true"]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd


def run_lm_eval(
    base_url: str,
    model_id: str,
    output_path: Path,
    log_path: Path,
    *,
    dataset: str,
    num_fewshot: int,
    api: str = "completions",
    chat_template_source: str | None = None,
    limit: int | None = None,
    timeout_s: float = 6 * 3600,
    max_gen_toks: int = 256,
    num_concurrent: int = 1,
) -> Path:
    """Run lm-eval into ``output_path`` (its own layout, plus ``task/`` and
    ``cellbench_run.json``), logging to ``log_path``."""
    if num_fewshot < 0:
        raise ValueError(f"num_fewshot must be >= 0, got {num_fewshot}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    output_path = Path(output_path)
    task_dir = output_path / "task"
    write_task(dataset, task_dir)
    cmd = lm_eval_command(
        base_url,
        model_id,
        output_path,
        task_dir=task_dir,
        api=api,
        num_fewshot=num_fewshot,
        limit=limit,
        max_gen_toks=max_gen_toks,
        num_concurrent=num_concurrent,
    )
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if is_local_dataset(dataset):
        # A local file needs nothing from the hub; the hub's dataset may need a download.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"# cellbench: {' '.join(cmd)}\n".encode())
        log.flush()
        try:
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired as e:
            raise LmEvalError(f"lm-eval ran past {timeout_s:g} s; see {log_path}") from e
    if rc != 0:
        raise LmEvalError(f"lm-eval exited with status {rc}; last lines:\n{_tail(log_path)}")
    info = {
        "lm_eval_model": LM_EVAL_MODELS[api],
        "api": api,
        "chat_template_source": chat_template_source,
        "dataset": dataset,
        "base_url": base_url,
    }
    write_json(output_path / RUN_INFO, info)
    return output_path


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def _num(v: Any) -> float | None:
    # lm-eval writes "N/A" for a stderr it could not compute.
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# lm-eval writes its mean as a float; the samples' mean agrees with it to rounding.
AGGREGATE_TOLERANCE = 1e-9


def sample_score(correct: list[bool]) -> tuple[float, float | None]:
    """Accuracy over per-question results and its standard error (the sample standard
    deviation over sqrt(n), as lm-eval reports it; None for fewer than two questions)."""
    n = len(correct)
    if n == 0:
        raise ValueError("no per-sample results: a score needs at least one question")
    mean = sum(correct) / n
    if n < 2:
        return mean, None
    var = sum((float(c) - mean) ** 2 for c in correct) / (n - 1)
    return mean, math.sqrt(var / n)


def _bench_of(run_dir: Path) -> Path:
    """The bench.json of the serve job whose lm-eval run lies in ``run_dir``
    (serve/ARM/lm_eval or serve/ARM/lm_eval/instance-K)."""
    lm_eval = run_dir if run_dir.name == "lm_eval" else run_dir.parent
    return lm_eval.parent / "bench.json"


def _latest(paths: list[Path]) -> Path:
    # lm-eval's file names end with an ISO-like timestamp, so name order is time order.
    return sorted(paths, key=lambda p: p.name)[-1]


def instance_dirs(lm_eval_dir: Path) -> list[Path]:
    """The ``instance-K`` folders under ``lm_eval_dir`` in K order (empty for the older layout
    of one run directly in the folder)."""
    found = []
    for d in Path(lm_eval_dir).glob(f"{INSTANCE_PREFIX}*"):
        k = d.name[len(INSTANCE_PREFIX) :]
        if d.is_dir() and k.isdigit():
            found.append((int(k), d))
    return [d for _, d in sorted(found)]


def _read_results(run_dir: Path) -> tuple[Path, dict[str, Any], str]:
    """The newest results file under ``run_dir``, its JSON, and its one GSM8K task (whose
    two exact-match scores it must hold)."""
    results_files = list(run_dir.rglob("results_*.json"))
    if not results_files:
        raise FileNotFoundError(f"no lm-eval results_*.json under {run_dir}")
    rf = _latest(results_files)
    try:
        res = json.loads(rf.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{rf}: lm-eval's results file is not whole JSON ({exc})") from None
    tasks = [t for t in res.get("results", {}) if t in (TASK, *OLD_TASKS)]
    if len(tasks) != 1:
        raise ValueError(
            f"{rf}: expected one gsm8k task in results, found {sorted(res['results'])}"
        )
    task = tasks[0]
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        if key not in res["results"][task]:
            raise ValueError(f"{rf}: results.{task} lacks {key!r}")
    return rf, res, task


def _read_samples(rf: Path, task: str) -> tuple[Path, list[dict[str, Any]]]:
    """The samples file beside ``rf`` (the same run's stamp, else the newest) and its rows,
    one per question in doc_id order, each with both filters' outcomes."""
    stamp = rf.name[len("results_") : -len(".json")]
    sample_files = list(rf.parent.glob(f"samples_{task}_{stamp}.jsonl")) or list(
        rf.parent.glob(f"samples_{task}_*.jsonl")
    )
    if not sample_files:
        raise FileNotFoundError(f"no samples_{task}_*.jsonl beside {rf} (run with --log_samples)")
    sample_file = _latest(sample_files)
    per: dict[int, dict[str, Any]] = {}
    with open(sample_file) as f:
        for line in f:
            if line.strip():
                _add_sample(per, line, f.name)
    per_sample = [per[k] for k in sorted(per)]
    for row in per_sample:
        if "strict" not in row or "flexible" not in row:
            raise ValueError(f"doc {row['doc_id']} lacks a strict or flexible sample line")
    keys = [row["doc_key"] for row in per_sample]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{rf}: the same question text appears twice; doc_key cannot pair it")
    return sample_file, per_sample


def _add_sample(per: dict[int, dict[str, Any]], line: str, name: str) -> None:
    """One line of lm-eval's samples file into its question's row (other filters skipped)."""
    try:
        s = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: a sample line is not whole JSON ({exc})") from None
    key = {"strict-match": "strict", "flexible-extract": "flexible"}.get(s.get("filter"))
    if key is None:
        return
    row = per.setdefault(int(s["doc_id"]), {"doc_id": int(s["doc_id"])})
    question = (s.get("doc") or {}).get("question")
    if not isinstance(question, str):
        raise ValueError(f"{name}: doc {s['doc_id']} has no question text")
    row["doc_key"] = doc_key(question)
    row[key] = bool(float(s["exact_match"]))
    row.setdefault("target", str(s.get("target", "")).split("####")[-1].strip())
    resp = s.get("filtered_resps") or [""]
    row[f"{key}_extracted"] = resp[0] if isinstance(resp, list) else resp


def parse_run(run_dir: Path) -> dict[str, Any]:
    """One lm-eval run (its newest results and samples under ``run_dir``): scores, per-sample
    rows keyed by ``doc_key``, and what ``cellbench_run.json`` recorded about how it ran."""
    run_dir = Path(run_dir)
    rf, res, task = _read_results(run_dir)
    r = res["results"][task]
    sample_file, per_sample = _read_samples(rf, task)
    n_shot = res.get("n-shot", {}).get(task)
    if n_shot is None:
        n_shot = res.get("configs", {}).get(task, {}).get("num_fewshot")
    n_samples = res.get("n-samples", {}).get(task, {}).get("effective", len(per_sample))
    if n_samples != len(per_sample):
        raise ValueError(f"{rf}: n-samples says {n_samples}, samples file has {len(per_sample)}")
    info_path = run_dir / RUN_INFO
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    # The scores are the samples' own means (a summary cannot then contradict its samples);
    # lm-eval's aggregate must agree, or its two files describe different runs.
    scores = {}
    for field, filt in (("strict", "strict-match"), ("flexible", "flexible-extract")):
        correct = [row[field] for row in per_sample]
        mean, stderr = sample_score(correct)
        reported = _num(r[f"exact_match,{filt}"])
        if reported is None or abs(reported - mean) > AGGREGATE_TOLERANCE:
            raise ValueError(
                f"{rf}: results.{task}.exact_match,{filt} = {r[f'exact_match,{filt}']!r}, but "
                f"its samples file ({sample_file.name}) has {sum(correct)} of "
                f"{len(correct)} correct = {mean!r}; expected lm-eval's two files from one run. "
                "Rerun lm-eval (the serve job) for this arm: snakemake --cores 2 --forcerun "
                f"{_bench_of(run_dir)}"
            )
        scores[field] = (mean, stderr)
    return {
        "task": task,
        "num_fewshot": int(n_shot) if n_shot is not None else None,
        "n_samples": int(n_samples),
        "strict_match": scores["strict"][0],
        "strict_match_stderr": scores["strict"][1],
        "flexible_extract": scores["flexible"][0],
        "flexible_extract_stderr": scores["flexible"][1],
        "lm_eval_version": res.get("lm_eval_version"),
        # Older runs did not record these; then they stay unknown rather than guessed.
        "lm_eval_model": info.get("lm_eval_model"),
        "api": info.get("api"),
        "chat_template_source": info.get("chat_template_source"),
        "dataset": info.get("dataset"),
        "results_file": str(rf.relative_to(run_dir)),
        "per_sample": per_sample,
    }


def parse_results(lm_eval_dir: Path, *, cell: str = "", arm: str = "") -> dict[str, Any]:
    """Read the GSM8K run(s) under ``lm_eval_dir`` into the gsm8k schema: instance 1's
    scores at the top level and, when the folder holds ``instance-K`` runs, every instance's
    scores and per-sample rows under ``instances``."""
    lm_eval_dir = Path(lm_eval_dir)
    dirs = instance_dirs(lm_eval_dir)
    if not dirs:  # one run, directly in the folder (the layout before instances)
        return {"cell": cell, "arm": arm, **parse_run(lm_eval_dir)}
    expected = [f"{INSTANCE_PREFIX}{k}" for k in range(1, len(dirs) + 1)]
    if [d.name for d in dirs] != expected:
        raise ValueError(
            f"{lm_eval_dir}: instance folders {[d.name for d in dirs]}, expected {expected}"
        )
    runs = [parse_run(d) for d in dirs]
    first = dict(runs[0])
    first["results_file"] = f"{dirs[0].name}/{first['results_file']}"
    instances = [
        {
            "instance": k,
            "strict_match": run["strict_match"],
            "flexible_extract": run["flexible_extract"],
            "n_samples": run["n_samples"],
            "per_sample": [
                {key: row[key] for key in ("doc_id", "doc_key", "strict", "flexible")}
                for row in run["per_sample"]
            ],
        }
        for k, run in enumerate(runs, start=1)
    ]
    return {"cell": cell, "arm": arm, **first, "instances": instances}


def _correct_by_question(instance: dict[str, Any], field: str) -> dict[Any, bool]:
    # Keyed by doc_key (question text) when every row has one, else by doc_id.
    rows = instance.get("per_sample") or []
    key = "doc_key" if rows and all("doc_key" in r for r in rows) else "doc_id"
    return {r[key]: bool(r[field]) for r in rows}


def instance_spread(instances: list[dict[str, Any]], field: str = "strict") -> dict[str, Any]:
    """How far one arm's GSM8K runs on separate server starts lie apart: min, max and range
    of the score, and the paired disagreement (questions answered right by one start and
    wrong by another) for each pair of starts, over the questions both ran."""
    score = {"strict": "strict_match", "flexible": "flexible_extract"}[field]
    values = [float(i[score]) for i in instances]
    pairs = []
    for a in range(len(instances)):
        for b in range(a + 1, len(instances)):
            x = _correct_by_question(instances[a], field)
            y = _correct_by_question(instances[b], field)
            shared = sorted(set(x) & set(y), key=str)
            pairs.append(
                {
                    "instances": (instances[a]["instance"], instances[b]["instance"]),
                    "n": len(shared),
                    "differ": sum(x[k] != y[k] for k in shared),
                }
            )
    low, high = min(values), max(values)
    return {"min": low, "max": high, "range": high - low, "pairs": pairs}


def instance_spread_lines(by_arm: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Markdown lines on the spread between server starts, one per arm that ran GSM8K on more
    than one (``by_arm``: arm label -> gsm8k.json's ``instances``), then the largest range
    beside the arms' own difference; empty when no arm has several starts."""
    lines = []
    ranges = {}
    for arm, instances in by_arm.items():
        if not instances or len(instances) < 2:
            continue
        spread = instance_spread(instances, "strict")
        ranges[arm] = spread["range"]
        worst = max(spread["pairs"], key=lambda p: p["differ"] / max(p["n"], 1))
        each = ", ".join(f"{100 * i['strict_match']:.2f}%" for i in instances)
        lines.append(
            f"- {arm}, strict-match on {len(instances)} server starts: {each} (min "
            f"{100 * spread['min']:.2f}%, max {100 * spread['max']:.2f}%, range "
            f"{100 * spread['range']:.2f} points); starts {worst['instances'][0]} and "
            f"{worst['instances'][1]} answer {worst['differ']} of {worst['n']} questions "
            "differently (right on one, wrong on the other)"
        )
    if not lines:
        return []
    firsts = {arm: inst[0]["strict_match"] for arm, inst in by_arm.items() if inst}
    if len(firsts) == 2:
        (a, x), (b, y) = firsts.items()
        lines.append(
            f"- {b} minus {a} at the first start: {100 * (y - x):+.2f} points; the largest "
            f"range between starts of one arm: {100 * max(ranges.values()):.2f} points. A "
            "difference between arms no larger than that is within what restarting the same "
            "server gives."
        )
    return ["Spread between server starts (gsm8k.instances):", "", *lines]


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (see module docstring)."""
    p = argparse.ArgumentParser(prog="python -m cellbench.gsm8k")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize", help="lm-eval output dir -> the project's gsm8k JSON")
    s.add_argument("--lm-eval-dir", required=True, type=Path)
    s.add_argument("--cell-id", required=True)
    s.add_argument("--arm", required=True, choices=["untuned", "tuned"])
    s.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    # The serve job recorded every file of the folder; one edited since is not lm-eval's.
    problem = a.lm_eval_dir.is_dir() and tree_problem(a.lm_eval_dir)
    if problem:
        print(
            f"cellbench gsm8k: error: {a.lm_eval_dir}: {problem}; rerun the serve job that "
            f"wrote it: snakemake --cores 2 --forcerun {a.lm_eval_dir} (with your "
            "--configfile, if any)",
            file=sys.stderr,
        )
        return 1
    try:
        summary = parse_results(a.lm_eval_dir, cell=a.cell_id, arm=a.arm)
        result_file.check_gsm8k(summary, a.out)
        write_json(a.out, summary, checksum=True)
    # JSON errors are ValueErrors, the schema's refusal a ResultError; one line, no traceback.
    except (OSError, ValueError, result_file.ResultError) as exc:
        print(f"cellbench gsm8k: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{a.cell_id} {a.arm}: strict {summary['strict_match']:.4f} "
        f"flexible {summary['flexible_extract']:.4f} (n={summary['n_samples']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
