"""Readers told the truth (issue 30, item 6): the report says which statistic its latency tables
show (the one the PR files and verdicts use, with its spread), when it was written, from which
commit and with which settings; PR files hold no host paths and a real title.

Inputs are stage results written by hand (``result_fixtures``), with a server command and log
line as the embedded default's serve job records them (absolute host paths included)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from cellbench.report import build as report
from cellbench.report import pr_markdown, sections
from support import result_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
CELL = "host-cpu/tiny-qwen3-moe/tp1-ep1"


def _cell(res: Path, **bench_extra: Any) -> list[Path]:
    host = str(res.resolve())
    files = [fx.write_tune(res, CELL)]
    for arm in ("untuned", "tuned"):
        model_dir = f"{host}/assets/models/tiny-qwen3-moe"  # res is .../results
        server = {
            "launcher": "local",
            "model": model_dir,
            "model_id": model_dir,
            "ready_s": 1.0,
            "command": [
                "/opt/venv/bin/python",
                "-m",
                "cellbench.serve.tf_serve",
                model_dir,
                f"--tuned-folder={host}/{CELL}/tune/configs",
            ],  # fmt: skip
            "env": {"VLLM_TUNED_CONFIG_FOLDER": f"{host}/{CELL}/tune/configs"},
        }
        line = f"Using default MoE config (looked in {host}/{CELL}/tune/configs)"
        moe = {"source": "default", "paths": [], "searched": [], "env": {}, "log_lines": [line]}
        points = [fx.point(seq=r, repeat=r, ttft=100.0 + 10 * r) for r in range(3)]
        files.append(
            fx.write_bench(res, CELL, arm, points, server=server, moe_config=moe, **bench_extra)
        )
        files.append(fx.write_gsm8k(res, CELL, arm, [True, False]))
    return files


def test_report_states_statistic_date_commit_and_settings(tmp_path):
    res = tmp_path / "results"
    text = report.write_report(_cell(res), tmp_path / "report", results=res).read_text()
    assert sections.LATENCY_NOTE in text
    # TTFT 100, 110, 120 over three repeats: median 110, half the IQR (105..115) 5
    ttft = text.split("#### TTFT (ms)")[1].split("####")[0]
    assert "| 512-512   | 110.00 ± 5.00" in ttft, ttft
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    assert re.search(rf"- Written \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC from commit `{commit}", text)
    # points written before starts were recorded: one server start, its three repeats
    assert (
        "- Serving: ISL-OSL 512-512; concurrency 16; 160 prompts per point; 1 server start "
        "and 3 repeats in all per point and arm" in text
    )
    assert "- Tuner: backend builtin, mode default, batch sizes 1, 4, device CPU_TRITON" in text


def test_pr_file_has_no_host_paths_and_a_real_title(tmp_path):
    res = tmp_path / "results"
    # The model's origin is what each bench read from the model folder's recipe file.
    recipe = f"{res.resolve()}/assets/models/tiny-qwen3-moe/cellbench_model.json"
    origin = {"read_from": recipe, "built_by": "cellbench.assets", "weights": "random"}
    report.write_report(_cell(res, model_origin=origin), tmp_path / "report", results=res)
    text = (tmp_path / "report" / "pr" / "tiny-qwen3-moe.md").read_text()
    assert text.startswith("# tiny-qwen3-moe (a random-weight model built by the workflow)\n")
    assert str(tmp_path) not in text and "/opt/venv" not in text
    assert f"results/{CELL}/tune/configs" in text  # the same paths, as the repository lays out
    assert "python -m cellbench.serve.tf_serve results/assets/models/tiny-qwen3-moe" in text


def test_portable_keeps_what_is_not_a_host_results_path():
    assert pr_markdown.portable("/cellbench/tuned") == "/cellbench/tuned"  # a container's
    assert pr_markdown.portable("--x=/a/results/b") == "--x=results/b"
    assert pr_markdown.portable("0.95") == "0.95"
    assert pr_markdown.display_title("m", ["Qwen/Qwen3-30B-A3B"]) == "Qwen/Qwen3-30B-A3B"
    # A folder's model: its origin as recorded, never assumed to be the workflow's.
    built = pr_markdown.display_title("m", ["results/assets/models/m"], {"cellbench.assets"})
    assert built == "m (a random-weight model built by the workflow)"
    for unknown in (set(), None, {"cellbench.assets", "someone"}):
        title = pr_markdown.display_title("m", ["/models/m"], unknown)
        assert (
            title == "m (served from a folder; the results do not record where the model came from)"
        )
