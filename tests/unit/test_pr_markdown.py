"""The PR-ready Markdown per model (cellbench.report.pr_markdown), built by the report from real
result
files (tests/support/result_fixtures.py) and compared, table by table, with seed 000's tables as
parsed from the seed itself at test time: same titles, same header rows, same row labels'
form, the Average row last, GSM8K's two rows."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from cellbench.report import build as report
from cellbench.report import frames, plots, pr_markdown
from support import result_fixtures as fx
from support.seed_shapes import (  # noqa: F401
    assert_seed_shapes,
    label_form,
    markdown_tables,
    seed_000,
    seed_dirs,
    seed_shapes,
    seed_tables,
    value_form,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen3-30b-a3b-fp8"
CELLS = (f"rocm7.2/{MODEL}/tp2-ep2", f"rocm7.2/{MODEL}/tp1-ep1")
OTHER_CELL = "rocm7.2/tiny-moe/tp1-ep1"
GRID = ((512, 512), (1024, 1024), (8192, 1024))
TUNED_DIR = "/tuned-configs"


def _evidence(arm: str) -> dict:
    name = fx.CONFIG_FILE
    if arm == "tuned":
        line = f"Using configuration from {TUNED_DIR}/{name} for MoE layer."
        return {"source": "tuned", "paths": [f"{TUNED_DIR}/{name}"], "searched": [],
                "log_lines": [line], "env": {"VLLM_TUNED_CONFIG_FOLDER": TUNED_DIR}}  # fmt: skip
    line = "Using default MoE config. Performance might be sub-optimal! Config file not found at x"
    return {"source": "default", "paths": [], "searched": ["x"], "log_lines": [line], "env": {}}


def _server(arm: str) -> dict:
    env = {"VLLM_ROCM_USE_AITER": "0"}
    if arm == "tuned":
        env["VLLM_TUNED_CONFIG_FOLDER"] = TUNED_DIR
    command = ["vllm", "serve", "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "-tp", "2",
               "--enable-expert-parallel", "--max-model-len", "65536"]  # fmt: skip
    return {"launcher": "docker", "model": "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8",
            "model_id": "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", "ready_s": 1.0,
            "command": command, "env": env}  # fmt: skip


def _write_cell(res: Path, cell: str, repeats: int) -> list[Path]:
    files = [fx.write_tune(res, cell, (1, 4, 16))]
    for arm, speed in (("untuned", 1.0), ("tuned", 0.8)):
        points = [
            fx.point(
                isl,
                osl,
                repeat=rep,
                seq=len(GRID) * rep + g,
                ttft=speed * (isl / 5 + 7 * rep + g),
                tpot=speed * (30 + rep),
            )  # fmt: skip
            for rep in range(repeats)
            for g, (isl, osl) in enumerate(GRID)
        ]
        files.append(
            fx.write_bench(res, cell, arm, points, server=_server(arm), moe_config=_evidence(arm))
        )
        files.append(fx.write_gsm8k(res, cell, arm, [True] * 83 + [False] * 17))
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A report over two cells of one model (3 and 1 repeats) and one cell of another, with
    the first cell's plots drawn by cellbench.report.plots before the report, as the workflow
    does. Built once for the module (the tests only read it): it is the slowest set-up of
    tests/unit."""
    tmp_path = tmp_path_factory.mktemp("pr_markdown")
    res = tmp_path / "results"
    files = _write_cell(res, CELLS[0], 3) + _write_cell(res, CELLS[1], 1)
    files += _write_cell(res, OTHER_CELL, 2)
    out = tmp_path / "report"
    plots.draw_cell(res, CELLS[0], out / "plots" / CELLS[0])
    report.write_report(files, out, results=res)
    return res, out


def test_one_file_per_model_in_the_seed_shapes(built):
    res, out = built
    assert sorted(p.name for p in (out / "pr").iterdir()) == [f"{MODEL}.md", "tiny-moe.md"]
    text = (out / "pr" / f"{MODEL}.md").read_text()
    assert_seed_shapes(text, sections=2)
    assert_seed_shapes((out / "pr" / "tiny-moe.md").read_text(), sections=1)
    # One section per cell of the model; the other model's cell is not in this file.
    assert [ln for ln in text.splitlines() if ln.startswith("## ")] == [
        "## rocm7.2, tp1-ep1",
        "## rocm7.2, tp2-ep2",
    ]
    assert "tiny-moe" not in text
    # The report's index lists the PR files with their checksums.
    index = (out / "INDEX.json").read_text()
    assert f'"pr/{MODEL}.md"' in index


def test_medians_with_their_spread_and_the_average_of_medians(built):
    res, out = built
    text = (out / "pr" / f"{MODEL}.md").read_text()
    section = text.split("## rocm7.2, tp2-ep2")[1]
    assert "median over the 3 repeats" in section and "half their interquartile range" in section
    ttft = next(t for t in markdown_tables(section) if t["title"] == "TTFT (ms)")
    bench = report.load_inputs([res / CELLS[0] / "serve/tuned/bench.json"], res)[0].data
    medians = []
    for row in ttft["rows"][:-1]:
        isl, osl = map(int, row[0].split("-"))
        values = [p["mean_ttft_ms"] for p in bench["points"] if (p["isl"], p["osl"]) == (isl, osl)]
        q1, q3 = np.percentile(values, [25, 75])
        medians.append(np.median(values))
        assert row[2] == f"{np.median(values):.2f} ± {(q3 - q1) / 2:.2f}"
    assert ttft["rows"][-1][2] == f"{np.mean(medians):.2f}"
    # One repeat: the value alone, and the file says why there is no spread.
    single = text.split("## rocm7.2, tp1-ep1")[1].split("\n## ")[0]
    assert pr_markdown.ONE_RUN_NOTE in single
    assert (
        "±"
        not in next(t for t in markdown_tables(single) if t["title"] == "TPOT (ms)")["rows"][0][1]
    )


def test_commands_configs_evidence_and_plots(built):
    res, out = built
    text = (out / "pr" / f"{MODEL}.md").read_text()
    section = text.split("## rocm7.2, tp2-ep2")[1]
    bench = {
        arm: report.load_inputs([res / CELLS[0] / f"serve/{arm}/bench.json"], res)[0].data
        for arm in ("untuned", "tuned")
    }
    # The server command and environment of each arm, as recorded, as seed 000 prints them.
    for arm, label in frames.ARM_LABELS.items():
        env = " ".join(f"{k}={v}" for k, v in sorted(bench[arm]["server"]["env"].items()))
        assert f"# {label}\n{env} {' '.join(bench[arm]['server']['command'])}\n" in section
    # The tuning command from the summary's argv, and the config file with its shape.
    summary = report.load_inputs([res / CELLS[0] / "tune/summary.json"], res)[0].data
    assert "python -m cellbench.tune " + " ".join(summary["argv"]) in section
    assert f"`{fx.CONFIG_FILE}` (E=8, N=32, device CPU_TRITON_INTERPRET, dtype not in" in section
    # The tuned arm's own log line, as its bench.json kept it.
    assert (
        f"- Triton MoE Tuned: **tuned**\n  `{bench['tuned']['moe_config']['log_lines'][0]}`"
        in section
    )
    # Plots: links to the files drawn for this cell, relative to the PR file, all existing;
    # none for the cell whose plots were not drawn.
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section.split("\n## ")[0])
    assert links and all((out / "pr" / link).is_file() for link in links)
    assert {Path(link).stem for link in links} == set(plots.ALWAYS)
    assert not re.findall(r"!\[", text.split("## rocm7.2, tp1-ep1")[1].split("\n## ")[0])


def test_config_name_fields_keep_the_block_shape_whole():
    name = "E=64,N=768,device_name=AMD_Radeon_R9700,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert pr_markdown.config_name_fields(name) == {
        "E": "64",
        "N": "768",
        "device_name": "AMD_Radeon_R9700",
        "dtype": "fp8_w8a8",
        "block_shape": "[128,128]",
    }


def test_renders_an_archived_run_through_the_cli_without_rerunning(built, tmp_path, capsys):
    """The module alone over a results folder (as an archived run holds one): same files."""
    res, out = built
    files = [
        str(p)
        for p in sorted(res.rglob("*.json"))
        if p.name in ("bench.json", "summary.json") or p.parent.name == "gsm8k"
    ]
    again = tmp_path / "again"
    assert (
        pr_markdown.main(
            ["--results", str(res), "--out-dir", str(again), "--report-dir", str(out), *files]
        )
        == 0
    )
    for name in (f"{MODEL}.md", "tiny-moe.md"):
        assert (again / name).read_text() == (out / "pr" / name).read_text()
