"""The PR-ready Markdown per model (cellbench.report.pr_markdown), built by the report from real
result
files (tests/result_fixtures.py) and compared, table by table, with seed 000's tables as
parsed from the seed itself at test time: same titles, same header rows, same row labels'
form, the Average row last, GSM8K's two rows."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import result_fixtures as fx
from cellbench.report import build as report
from cellbench.report import frames, plots, pr_markdown

ROOT = Path(__file__).resolve().parents[1]
MODEL = "qwen3-30b-a3b-fp8"
CELLS = (f"rocm7.2/{MODEL}/tp2-ep2", f"rocm7.2/{MODEL}/tp1-ep1")
OTHER_CELL = "rocm7.2/tiny-moe/tp1-ep1"
GRID = ((512, 512), (1024, 1024), (8192, 1024))
TUNED_DIR = "/tuned-configs"


def seed_dirs() -> list[Path]:
    """Where seed 000 may be: $CELLBENCH_SEEDS_DIR, a shared/ folder in or beside the tree."""
    env = os.environ.get("CELLBENCH_SEEDS_DIR")
    return [Path(env)] if env else [ROOT / "shared" / "seeds", ROOT.parent / "shared" / "seeds"]


def seed_000() -> str:
    for folder in seed_dirs():
        found = sorted(folder.glob("000_*.txt"))
        if found:
            return found[0].read_text()
    pytest.skip(
        "seed 000 (000_*.txt) not found in "
        + ", ".join(map(str, seed_dirs()))
        + "; set CELLBENCH_SEEDS_DIR to the seeds folder"
    )


def seed_tables(text: str) -> list[dict]:
    """Seed 000's tables (tab-separated lines) with the line above each as its title."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if "\t" not in lines[i]:
            i += 1
            continue
        title = next(t.strip() for t in reversed(lines[:i]) if t.strip())
        rows = []
        while i < len(lines) and "\t" in lines[i]:
            rows.append([c.strip() for c in lines[i].split("\t")])
            i += 1
        tables.append({"title": title, "header": rows[0], "rows": rows[1:]})
    return tables


def markdown_tables(text: str) -> list[dict]:
    """The pipe tables of a Markdown file, each with the heading above it as its title."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        title = next(t.lstrip("#").strip() for t in reversed(lines[:i]) if t.startswith("#"))
        block = []
        while i < len(lines) and lines[i].startswith("|"):
            block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
            i += 1
        assert set("".join(block[1])) <= set("- :"), f"no separator row under {block[0]}"
        tables.append({"title": title, "header": block[0], "rows": block[2:]})
    return tables


def seed_shapes() -> tuple[list[dict], dict]:
    """Seed 000's latency tables of its first model (the three metric tables), and its
    first GSM8K table."""
    tables = seed_tables(seed_000())
    latency = [t for t in tables if t["header"][0] == "ISL-OSL"]
    gsm8k = [t for t in tables if t["header"][0] == "Metric" and "strict" in t["rows"][0][0]]
    assert latency and gsm8k, "seed 000 no longer holds its tables"
    titles = list(dict.fromkeys(t["title"] for t in latency))
    return latency[: len(titles)], gsm8k[0]


def label_form(label: str) -> str:
    """A row label's form: digits become 9 (512-512 and 16384-2048 have the same form)."""
    return re.sub(r"\d+", "9", label)


def value_form(value: str) -> str:
    """A value's form without our spread (" ± x"): digits become 9."""
    return re.sub(r"\d+", "9", value.split(" ± ")[0])


def assert_seed_shapes(text: str, sections: int) -> None:
    """Every cell section of a PR file holds seed 000's tables, in the seed's order, with its
    titles, header rows, row-label forms, value forms, the Average row last, GSM8K's rows."""
    seed_latency, seed_gsm8k = seed_shapes()
    got = markdown_tables(text)
    per_cell = len(seed_latency) + 1
    assert len(got) == sections * per_cell, [t["title"] for t in got]
    for k in range(sections):
        section = got[k * per_cell : (k + 1) * per_cell]
        for mine, seed in zip(section, seed_latency, strict=False):
            assert mine["title"] == seed["title"]
            assert mine["header"] == seed["header"]
            assert mine["rows"][-1][0] == seed["rows"][-1][0] == "Average"
            seed_forms = {label_form(r[0]) for r in seed["rows"][:-1]}
            assert {label_form(r[0]) for r in mine["rows"][:-1]} <= seed_forms
            for row in mine["rows"]:
                assert len(row) == len(seed["header"])
                assert {value_form(v) for v in row[1:]} <= {
                    value_form(v) for v in seed["rows"][0][1:]
                }
        gsm = section[-1]
        assert gsm["header"] == seed_gsm8k["header"]
        assert [r[0] for r in gsm["rows"]] == [r[0] for r in seed_gsm8k["rows"]]
        seed_values = {value_form(v) for r in seed_gsm8k["rows"] for v in r[1:]}
        assert {value_form(v) for r in gsm["rows"] for v in r[1:]} <= seed_values


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


@pytest.fixture
def built(tmp_path):
    """A report over two cells of one model (3 and 1 repeats) and one cell of another, with
    the first cell's plots drawn by cellbench.report.plots before the report, as the workflow
    does."""
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
