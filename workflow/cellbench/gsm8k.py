"""GSM8K through lm-eval 0.4.13 against a running server, and its results in cellbench's schema.

``run_lm_eval`` runs lm-eval's CLI as a subprocess with ``local-completions`` against
``{base_url}/v1/completions`` (offline, ``--log_samples``), either on the local ``gsm8k_local``
task (``task_dir`` given, passed as ``--include_path``) or on lm-eval's own ``gsm8k``.
``parse_results`` reads lm-eval's ``results_*.json`` and ``samples_<task>_*.jsonl`` into::

    {cell, arm, task, num_fewshot, n_samples, strict_match, strict_match_stderr,
     flexible_extract, flexible_extract_stderr, per_sample: [{doc_id, strict, flexible}]}

CLI (the gsm8k rule)::

    python -m cellbench.gsm8k summarize --lm-eval-dir DIR --cell-id ID --arm ARM --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cellbench.atomicio import write_json

LOCAL_TASK = "gsm8k_local"
BUILTIN_TASK = "gsm8k"
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "gsm8k.schema.json"


class LmEvalError(RuntimeError):
    """lm-eval failed or left no results; the message carries its log tail."""


def lm_eval_command(
    base_url: str,
    model_id: str,
    output_path: Path,
    *,
    task_dir: Path | None,
    num_fewshot: int,
    limit: int | None,
    seed: int = 0,
    max_gen_toks: int = 256,
    num_concurrent: int = 1,
) -> list[str]:
    """The lm-eval command line for one GSM8K run."""
    task = LOCAL_TASK if task_dir is not None else BUILTIN_TASK
    model_args = ",".join(
        [
            f"model={model_id}",
            f"base_url={base_url.rstrip('/')}/v1/completions",
            "tokenizer_backend=None",
            "tokenized_requests=False",
            # Requests in flight at once: a batching server answers them in shared steps.
            f"num_concurrent={num_concurrent}",
            "max_retries=3",
            f"max_gen_toks={max_gen_toks}",
        ]
    )
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions"]
    cmd += ["--model_args", model_args, "--tasks", task, "--num_fewshot", str(num_fewshot)]
    cmd += ["--batch_size", "1", "--output_path", str(output_path), "--log_samples"]
    cmd += ["--seed", str(seed)]
    if task_dir is not None:
        cmd += ["--include_path", str(task_dir)]
    if limit:
        cmd += ["--limit", str(limit)]
    return cmd


def run_lm_eval(
    base_url: str,
    model_id: str,
    output_path: Path,
    log_path: Path,
    *,
    task_dir: Path | None,
    num_fewshot: int,
    limit: int | None = None,
    timeout_s: float = 6 * 3600,
    max_gen_toks: int = 256,
    num_concurrent: int = 1,
) -> Path:
    """Run lm-eval into ``output_path`` (its own layout), logging to ``log_path``."""
    if num_fewshot < 0:
        raise ValueError(f"num_fewshot must be >= 0, got {num_fewshot}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if task_dir is not None and not (Path(task_dir) / f"{LOCAL_TASK}.yaml").is_file():
        raise ValueError(f"gsm8k task dir {task_dir} has no {LOCAL_TASK}.yaml")
    cmd = lm_eval_command(
        base_url,
        model_id,
        output_path,
        task_dir=task_dir,
        num_fewshot=num_fewshot,
        limit=limit,
        max_gen_toks=max_gen_toks,
        num_concurrent=num_concurrent,
    )
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if task_dir is not None:
        # The local task needs nothing from the hub; lm-eval's own gsm8k may need its dataset.
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


def _latest(paths: list[Path]) -> Path:
    # lm-eval's file names end with an ISO-like timestamp, so name order is time order.
    return sorted(paths, key=lambda p: p.name)[-1]


def parse_results(lm_eval_dir: Path, *, cell: str = "", arm: str = "") -> dict[str, Any]:
    """Read lm-eval's newest results and samples under ``lm_eval_dir`` into the gsm8k schema."""
    lm_eval_dir = Path(lm_eval_dir)
    results_files = list(lm_eval_dir.rglob("results_*.json"))
    if not results_files:
        raise FileNotFoundError(f"no lm-eval results_*.json under {lm_eval_dir}")
    rf = _latest(results_files)
    res = json.loads(rf.read_text())
    tasks = [t for t in res.get("results", {}) if t in (LOCAL_TASK, BUILTIN_TASK)]
    if len(tasks) != 1:
        raise ValueError(
            f"{rf}: expected one gsm8k task in results, found {sorted(res['results'])}"
        )
    task = tasks[0]
    r = res["results"][task]
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        if key not in r:
            raise ValueError(f"{rf}: results.{task} lacks {key!r}")
    stamp = rf.name[len("results_") : -len(".json")]
    sample_files = list(rf.parent.glob(f"samples_{task}_{stamp}.jsonl")) or list(
        rf.parent.glob(f"samples_{task}_*.jsonl")
    )
    if not sample_files:
        raise FileNotFoundError(f"no samples_{task}_*.jsonl beside {rf} (run with --log_samples)")
    per: dict[int, dict[str, Any]] = {}
    with open(_latest(sample_files)) as f:
        for line in f:
            if not line.strip():
                continue
            s = json.loads(line)
            key = {"strict-match": "strict", "flexible-extract": "flexible"}.get(s.get("filter"))
            if key is None:
                continue
            row = per.setdefault(int(s["doc_id"]), {"doc_id": int(s["doc_id"])})
            row[key] = bool(float(s["exact_match"]))
            row.setdefault("target", str(s.get("target", "")).split("####")[-1].strip())
            resp = s.get("filtered_resps") or [""]
            row[f"{key}_extracted"] = resp[0] if isinstance(resp, list) else resp
    per_sample = [per[k] for k in sorted(per)]
    for row in per_sample:
        if "strict" not in row or "flexible" not in row:
            raise ValueError(f"doc {row['doc_id']} lacks a strict or flexible sample line")
    n_shot = res.get("n-shot", {}).get(task)
    if n_shot is None:
        n_shot = res.get("configs", {}).get(task, {}).get("num_fewshot")
    n_samples = res.get("n-samples", {}).get(task, {}).get("effective", len(per_sample))
    if n_samples != len(per_sample):
        raise ValueError(f"{rf}: n-samples says {n_samples}, samples file has {len(per_sample)}")
    return {
        "cell": cell,
        "arm": arm,
        "task": task,
        "num_fewshot": int(n_shot) if n_shot is not None else None,
        "n_samples": int(n_samples),
        "strict_match": float(r["exact_match,strict-match"]),
        "strict_match_stderr": _num(r.get("exact_match_stderr,strict-match")),
        "flexible_extract": float(r["exact_match,flexible-extract"]),
        "flexible_extract_stderr": _num(r.get("exact_match_stderr,flexible-extract")),
        "lm_eval_version": res.get("lm_eval_version"),
        "results_file": str(rf.relative_to(lm_eval_dir)),
        "per_sample": per_sample,
    }


def validate(summary: dict[str, Any]) -> None:
    """Check ``summary`` against workflow/schemas/gsm8k.schema.json."""
    import jsonschema

    jsonschema.validate(summary, json.loads(SCHEMA_PATH.read_text()))


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
    summary = parse_results(a.lm_eval_dir, cell=a.cell_id, arm=a.arm)
    validate(summary)
    write_json(a.out, summary, checksum=True)
    print(
        f"{a.cell_id} {a.arm}: strict {summary['strict_match']:.4f} "
        f"flexible {summary['flexible_extract']:.4f} (n={summary['n_samples']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
