"""Report tables: the seeds' shapes, averages, and change-vs-noise verdicts.

The stage outputs here are written by the test with chosen values, so that every figure in the
rendered tables can be checked by hand; the real pipeline's outputs go through the same code in
tests/workflow/test_pipeline_local.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from cellbench.archive import write as archive
from cellbench.report import build as report
from cellbench.report import frames, sections
from cellbench.results import archived as archive_read
from support import result_fixtures as fx

CELL = "rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2"
GRID = [(512, 512), (1024, 1024)]


def write_bench(results: Path, cell: str, arm: str, ttft: dict, tpot: float = 30.0) -> Path:
    """One arm's points: each repeat in its own server start, the two arms interleaved (one
    job-wide order, untuned first), as a pair job of one repeat per start records them."""
    points = []
    for repeat, values in ttft.items():
        for (isl, osl), v in zip(GRID, values, strict=True):
            points.append(
                fx.point(
                    isl,
                    osl,
                    repeat=repeat,
                    start=repeat,
                    seq=2 * len(points) + (arm == "tuned"),
                    ttft=v,
                    tpot=tpot + repeat,
                    e2el=v + osl * tpot,
                    throughput=1000.0 / tpot,
                )
            )
    return fx.write_bench(results, cell, arm, points)


def write_gsm8k(results: Path, cell: str, arm: str, correct: list[bool]) -> Path:
    return fx.write_gsm8k(results, cell, arm, correct)


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "results"
    files = [
        # untuned: stable around 100/200 ms; tuned: clearly lower TTFT at 512, same at 1024
        write_bench(res, CELL, "untuned", {0: [100.0, 200.0], 1: [101.0, 199.0], 2: [99.0, 201.0]}),
        write_bench(res, CELL, "tuned", {0: [80.0, 201.0], 1: [81.0, 198.0], 2: [79.0, 200.0]}),
        write_gsm8k(res, CELL, "untuned", [True] * 80 + [False] * 20),
        write_gsm8k(res, CELL, "tuned", [True] * 78 + [False] * 2 + [True] * 5 + [False] * 15),
    ]
    return res, files


def test_tables_in_the_seeds_shape(results, tmp_path):
    res, files = results
    out = report.write_report(files, tmp_path / "report", results=res)
    text = out.read_text()
    assert "#### TTFT (ms)" in text and "#### TPOT (ms)" in text and "#### E2E Latency (ms)" in text
    assert "| ISL-OSL   | Triton MoE Untuned   | Triton MoE Tuned   |" in text
    # TTFT medians over the three repeats ± half their IQR (as the PR files and verdicts), and
    # the Average row over the grid's medians; the table says which statistic it shows
    assert sections.LATENCY_NOTE in text
    assert "| 512-512   | 100.00 ± 0.50        | 80.00 ± 0.50       |" in text
    assert "| 1024-1024 | 200.00 ± 0.50        | 200.00 ± 0.75      |" in text
    assert "| Average   | 150.00               | 140.00             |" in text
    # GSM8K: percentages with stderr, and the paired table (both right, both wrong, fixed,
    # broken; accuracies; difference) of the untuned-vs-tuned section
    assert "| exact_match, strict-match     | 80.00% ± 1.00        | 83.00% ± 1.00      |" in text
    assert "GSM8K, paired by `doc_id` on 100 questions:" in text
    strict = next(line for line in text.splitlines() if line.startswith("| strict-match "))
    cells = [c.strip() for c in strict.strip("|").split("|")]
    assert cells[1:7] == ["78", "15", "5", "2", "80.00%", "83.00%"]
    assert cells[7].startswith("+3.00% [")


def test_change_and_noise_are_told_apart(results, tmp_path):
    res, files = results
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    table = text.split("#### Untuned (A) vs tuned (B)")[1]
    rows = {
        (line.split("|")[1].strip(), line.split("|")[2].strip()): line
        for line in table.splitlines()
        if line.startswith("| 512") or line.startswith("| 1024")
    }
    # TTFT 100 -> 80 ms (lower is better), starts 1 ms apart: a real change, measured on the
    # three starts' spread; the change is the geometric means' ratio the row shows
    better = rows[("512-512", "mean_ttft_ms")]
    assert "| better " in better and "-20.0%" in better and "| 100.00 " in better
    # 200 -> 200 ms give or take 1: the interval is wider than +-2%, so not equivalent, and
    # the row says what it could have seen
    same = rows[("1024-1024", "mean_ttft_ms")]
    assert "| inconclusive " in same and "%" in same.split("| inconclusive ")[1]
    assert "Median detectable change over the table" in table


def test_one_run_a_side_gets_no_verdict(tmp_path):
    res = tmp_path / "results"
    files = [
        fx.write_bench(res, CELL, arm, [fx.point(ttft=ttft)])
        for arm, ttft in (("untuned", 100.0), ("tuned", 50.0))
    ]
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    table = text.split("#### Untuned (A) vs tuned (B)")[1].split("Serving verdicts:")[0]
    assert "n/a (one server start a side" in table and "| better" not in table
    assert "Start-to-start noise not measured (one server start a side" in table


def test_csv_tables_are_tidy(results, tmp_path):
    res, files = results
    report.write_report(files, tmp_path / "report", results=res)
    serve = pd.read_csv(tmp_path / "report" / "serve.csv")
    assert len(serve) == 2 * 3 * len(GRID)  # arms x repeats x points
    assert {
        "cell",
        "image",
        "model",
        "tp",
        "ep",
        "arm",
        "repeat",
        "isl",
        "osl",
        "mean_ttft_ms",
    } <= set(serve.columns)
    gsm = pd.read_csv(tmp_path / "report" / "gsm8k.csv")
    assert sorted(gsm.arm) == ["tuned", "untuned"]


def test_archive_manifest_covers_every_file(results, tmp_path):
    res, _ = results
    fx.write_tune(res, CELL)
    root = tmp_path / "archive"
    done = archive.build_run(
        "rocm7.2", res, [CELL], {"rocm7.2": "sha256:abc"}, "f00", root, "docker"
    )
    out_dir = root / "rocm7.2" / done.run
    manifest_path, manifest = out_dir / "MANIFEST.json", done.manifest
    archived = {p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file()}
    assert archived - {"MANIFEST.json"} == set(manifest["files"])
    receipt = json.loads((root / "rocm7.2" / "ARCHIVED.json").read_text())
    assert receipt["run"] == done.run
    assert receipt["manifest_sha256"] == archive.sha256_file(manifest_path)
    assert f"{CELL}/serve/tuned/bench.json" in manifest["files"]
    assert "report/report.md" in manifest["files"]
    assert manifest["images"] == {"rocm7.2": "sha256:abc"}
    assert manifest["host_packages"]["pandas"]
    # The tuner's versions come from the cell's tune summary (read inside the image on
    # docker), not from this host.
    summary = json.loads((res / CELL / "tune/summary.json").read_text())
    measured = manifest["tuner_packages"][CELL]
    assert measured["read_from"] == f"{CELL}/tune/summary.json"
    assert (measured["torch"], measured["triton"]) == (
        summary["torch_version"],
        summary["triton_version"],
    )
    assert archive_read.verify(manifest_path) == []
    changed = manifest_path.parent / CELL / "serve/tuned/bench.json"
    changed.chmod(0o644)  # archived files are read-only
    changed.write_text("{}")
    assert archive_read.verify(manifest_path) == [f"{CELL}/serve/tuned/bench.json"]


def test_min_change_pct_reaches_the_verdicts(results, tmp_path):
    """A margin above the 20% TTFT change, whose interval lies inside +-25%: equivalent (not
    worth calling), and the footer says so; a margin of 0 or below is refused before any
    work."""
    res, files = results
    text = report.write_report(
        files, tmp_path / "report", results=res, min_change_pct=25
    ).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 512-512   | mean_ttft"))
    assert "| equivalent " in row
    assert "inside +-25%" in text
    for bad in ("-1", "0"):
        with pytest.raises(SystemExit):
            report.main(
                ["--out-dir", str(tmp_path / "r3"), "--min-change-pct", bad, *map(str, files)]
            )
        assert not (tmp_path / "r3").exists()


def test_concurrency_levels_are_kept_apart(tmp_path):
    res = tmp_path / "results"
    rows = []
    for conc, ttft in ((1, 10.0), (16, 100.0)):
        for repeat in range(2):
            rows.append(
                fx.point(
                    repeat=repeat,
                    seq=len(rows),
                    concurrency=conc,
                    ttft=ttft + repeat,
                    tpot=1.0,
                    e2el=2.0,
                    throughput=3.0,
                )
            )
    files = [fx.write_bench(res, CELL, arm, rows) for arm in ("untuned", "tuned")]
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    assert "| 512-512 @c1  | 10.50" in text and "| 512-512 @c16 | 100.50" in text


def test_parallelism_the_servers_ran_is_shown_when_it_differs(tmp_path):
    """bench.json's tp/ep are read from the server's command line; a cell served with other
    sizes than it names (the local runtime's one-process server) is flagged in its section."""
    res = tmp_path / "results"
    layout = "host-cpu/tiny-qwen3-moe/tp2-ep2"
    same = "host-cpu/tiny-qwen3-moe/tp1-ep1"
    files = []
    for cell in (layout, same):
        for arm in ("untuned", "tuned"):
            files.append(
                fx.write_bench(res, cell, arm, [fx.point()], tp=1, ep=1, tp_requested=int(cell[-5]))
            )
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    section = text.split(f"## {layout}")[1].split("## ")[0]
    assert (
        "The cell asks for tp 2, ep 2; its servers were started with tuned: tp 1, ep 1; "
        "untuned: tp 1, ep 1" in section
    )
    assert "Parallelism differs" not in text.split(f"## {same}")[1].split("## ")[0]


def _evidence(source: str, path: str | None = None) -> dict:
    line = (
        f"Using configuration from {path} for MoE layer."
        if path
        else "Using default MoE config. Performance might be sub-optimal! Config file not "
        "found at x.json"
    )
    return {
        "source": source,
        "paths": [path] if path else [],
        "searched": [],
        "log_lines": [line],
        "env": {},
    }


def test_each_arms_moe_config_and_a_shipped_arm_are_shown(tmp_path):
    """The servers' evidence reaches the report: the tuned arm's file, and an untuned arm that
    loaded the image's own config is titled 'shipped', not 'untuned'."""
    res = tmp_path / "results"
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    shipped = f"/usr/lib/python3/dist-packages/vllm/model_executor/layers/fused_moe/configs/{name}"
    tuned = f"/cellbench/tuned-configs/{name}"
    files = [
        fx.write_bench(
            res,
            CELL,
            "untuned",
            [fx.point()],
            moe_config=_evidence("shipped", shipped),
            arm_label="shipped",
            tuned_config_applied=False,
        ),
        fx.write_bench(
            res,
            CELL,
            "tuned",
            [fx.point()],
            moe_config=_evidence("tuned", tuned),
            arm_label="tuned",
            tuned_config_applied=True,
        ),
    ]
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    assert (
        "Fused-MoE config, from the servers' logs: untuned (labelled shipped): the image's "
        f"own file `{name}`; tuned: its tuned file `{name}`." in text
    )
    assert frames.SHIPPED_LABEL in text and frames.ARM_LABELS["untuned"] not in text


def test_arms_whose_servers_ran_no_triton_moe_are_not_compared(tmp_path):
    """vLLM's CPU build logs no fused-MoE config on either arm (source 'none seen'): the report
    says the arms cannot differ instead of printing verdicts, even where their numbers differ;
    a cell whose servers did load configs keeps its comparison."""
    res = tmp_path / "results"
    cpu_cell, gpu_cell = "host-cpu/tiny-qwen3-moe/tp1-ep1", CELL
    none_seen = {"source": "none seen", "paths": [], "searched": [], "log_lines": [], "env": {}}
    vllm_server = {"launcher": "local", "model": "m", "model_id": "m", "ready_s": 1.0}
    files = []
    for arm, ttft in (("untuned", 100.0), ("tuned", 60.0)):
        pts = [fx.point(repeat=r, seq=r, ttft=ttft + r) for r in range(3)]
        files.append(
            fx.write_bench(
                res,
                cpu_cell,
                arm,
                pts,
                runtime="local",
                moe_config=none_seen,
                arm_label=arm,
                # What the banner reads: vLLM's server, whose log named the CPU as its device.
                server={**vllm_server, "command": ["python", "-m", "vllm.entrypoints.openai"]},
                parallel_observed={"device": "cpu"},
            )
        )
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    files.append(
        fx.write_bench(res, gpu_cell, "untuned", [fx.point(seq=0)], moe_config=_evidence("default"))
    )
    files.append(
        fx.write_bench(
            res,
            gpu_cell,
            "tuned",
            [fx.point(seq=1)],
            moe_config=_evidence("tuned", f"/cellbench/tuned-configs/{name}"),
        )
    )
    text = report.write_report(files, tmp_path / "report", results=res).read_text()
    cpu = text.split(f"## {cpu_cell}")[1].split("\n## ")[0]
    gpu = text.split(f"## {gpu_cell}")[1].split("\n## ")[0]
    assert "#### Untuned (A) vs tuned (B)\n\n" + report.NO_TRITON_MOE_NOTE in cpu
    assert "noise" in report.NO_TRITON_MOE_NOTE and "cannot differ" in report.NO_TRITON_MOE_NOTE
    # no verdict table for the CPU cell although its TTFTs differ by 40 %
    assert "| verdict" not in cpu and "| verdict" in gpu
    assert report.NO_TRITON_MOE_NOTE not in gpu
    assert "Untuned (A) vs tuned (B)" in gpu and "|" in gpu.split("Untuned (A) vs tuned (B)")[1]
    # the whole-report note for the local runtime only when every cell ran no Triton MoE
    only_cpu = report.write_report(files[:2], tmp_path / "report2", results=res, runtime="local")
    assert "served by vLLM on the CPU" in only_cpu.read_text()
    assert "served by vLLM on the CPU" not in report.render(
        *report.cell_frames(report.load_inputs(files, res)), runtime="local"
    )


def _starts_bench(root: Path, arm: str, ttft: list[float]) -> Path:
    """One arm of a pair job at one grid point, one repeat a start, the arms interleaved."""
    points = [
        fx.point(512, 512, repeat=k, start=k, seq=2 * k + (arm == "tuned"), ttft=v)
        for k, v in enumerate(ttft)
    ]
    return fx.write_bench(root, CELL, arm, points)


def test_the_archives_earlier_runs_are_pooled_into_the_verdict(tmp_path):
    """Two starts a side measure the start-to-start noise with one degree of freedom; the
    archive's earlier runs of the cell (same digest) add theirs, and the row says so."""
    from cellbench.report.priors import archive_priors
    from cellbench.stats import comparison

    res, archive_root = tmp_path / "results", tmp_path / "archive"
    files = [
        _starts_bench(res, "untuned", [100.0, 103.0]),
        _starts_bench(res, "tuned", [90.0, 92.0]),
    ]
    for n, shift in enumerate((0.0, 1.0, -1.0)):
        run = archive_root / "rocm7.2" / f"2026-12-0{n + 1}T00-00-00Z"
        _starts_bench(run, "untuned", [100.0 + shift, 102.0, 99.0])
        _starts_bench(run, "tuned", [100.0 + shift, 101.0, 100.0])
    # the current run archived already (the same files): left out
    copy = archive_root / "rocm7.2" / "2026-12-09T00-00-00Z" / CELL / "serve"
    for arm, path in zip(("untuned", "tuned"), files, strict=True):
        (copy / arm).mkdir(parents=True)
        (copy / arm / "bench.json").write_bytes(path.read_bytes())
    priors = archive_priors(archive_root, res, [CELL])
    # three earlier runs of three starts: 2 degrees of freedom each between starts
    assert priors[CELL][((512, 512, 16), "mean_ttft_ms")]["d"].df_between == 3 * 2
    serve, _, _ = frames.load_tables(files, res)
    a, b = (serve[serve.arm == arm] for arm in ("untuned", "tuned"))
    alone = next(r for r in comparison.compare_serve(a, b) if r["metric"] == "mean_ttft_ms")
    pooled = next(
        r
        for r in comparison.compare_serve(a, b, priors=priors[CELL])
        if r["metric"] == "mean_ttft_ms"
    )
    assert alone["df"] == 1 and alone["prior_df"] == 0
    assert pooled["df"] == 1 + 6 and pooled["prior_df"] == 6
    assert pooled["mdc_pct"] < alone["mdc_pct"]  # history narrows what the row can see
    text = report.write_report(files, tmp_path / "report", results=res, archive_root=archive_root)
    row = next(ln for ln in text.read_text().splitlines() if "| mean_ttft_ms" in ln)
    assert "paired by start + history (6 df)" in row
