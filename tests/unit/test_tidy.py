"""The tidy table (cellbench.report.tidy): one row per measured number, live results and archived
runs alike, read through cellbench.results.loaders; written as Parquet and CSV that read back
equal."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cellbench import cli
from cellbench.archive import write as archive
from cellbench.contracts.result_file import ResultError
from cellbench.report import tidy
from support import t21_cells as cells

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["run", "image", "digest", "model", "tp", "ep", "arm", "config_source", "isl", "osl",
        "concurrency", "repeat", "metric", "value"]  # fmt: skip


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "results"
    cells.write_cell(res)
    return res


def _numbers(point: dict) -> int:
    """The measured numbers of one grid point (what the table must hold a row for)."""
    return sum(
        1
        for k, v in point.items()
        if k not in tidy.POINT_KEYS and isinstance(v, int | float) and not isinstance(v, bool)
    )


def test_one_row_per_measured_number(results):
    frame = tidy.tidy(results)
    assert set(KEYS) <= set(frame.columns)
    cell_dir = results / cells.CELL
    expected_serve = 0
    for arm in ("untuned", "tuned"):
        bench = json.loads((cell_dir / f"serve/{arm}/bench.json").read_text())
        expected_serve += sum(_numbers(p) for p in bench["points"])
    serve = frame[frame.stage == "serve"]
    assert len(serve) == expected_serve
    # Every (arm, point, repeat, metric) once: the keys identify a row.
    assert not frame.duplicated(["stage", "arm", "batch_size", "isl", "osl", "concurrency",
                                 "repeat", "metric"]).any()  # fmt: skip
    # One TTFT row per arm, grid point and repeat, with the file's value.
    ttft = serve[serve.metric == "mean_ttft_ms"]
    assert len(ttft) == 2 * len(cells.GRID) * cells.REPEATS
    bench = json.loads((cell_dir / "serve/tuned/bench.json").read_text())
    p = bench["points"][-1]
    row = ttft[(ttft.arm == "tuned") & (ttft.isl == p["isl"]) & (ttft.repeat == p["repeat"])]
    assert row.value.tolist() == [p["mean_ttft_ms"]]
    assert row.iloc[0].concurrency == p["max_concurrency"]
    # The config source each server logged; the digest its serve results recorded.
    assert set(serve[serve.arm == "tuned"].config_source) == {"tuned"}
    assert set(serve[serve.arm == "untuned"].config_source) == {"default"}
    assert set(frame.digest) == {bench["image_digest"]}
    assert set(frame.run) == {"live"}
    layout = zip(frame.image, frame.model, frame.tp, frame.ep, strict=True)
    assert set(layout) == {("rocm7.2", "tiny-a", 1, 1)}


def test_gsm8k_and_tuner_rows(results):
    frame = tidy.tidy(results)
    gsm = frame[frame.stage == "gsm8k"]
    for arm in ("untuned", "tuned"):
        data = json.loads((results / cells.CELL / f"gsm8k/{arm}.json").read_text())
        rows = gsm[gsm.arm == arm].set_index("metric").value
        assert rows["strict_match"] == data["strict_match"]
        assert rows["n_samples"] == data["n_samples"]
        assert gsm[gsm.arm == arm].isl.isna().all()
    tune = frame[frame.stage == "tune"]
    assert sorted(set(tune.batch_size)) == list(cells.BATCH_SIZES)
    assert tune.arm.isna().all()
    for m, base in cells.BASELINE_US.items():
        at_m = tune[tune.batch_size == m]
        assert at_m[at_m.metric == "baseline_us"].value.item() == base
        assert at_m[at_m.metric == "baseline_us"].config_source.item() == "default"
        assert at_m[at_m.metric == "pick_us"].value.item() == base / 2
        assert at_m[at_m.metric == "roofline_fraction"].value.item() == pytest.approx(0.1 * m**0.5)


def test_parquet_and_csv_read_back_equal(results, tmp_path):
    frame = tidy.tidy(results)
    parquet, csv = tidy.write_tidy(frame, tmp_path / "out")
    back = pd.read_parquet(parquet)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    from_csv = pd.read_csv(csv)
    assert len(from_csv) == len(frame)
    assert from_csv.value.sum() == pytest.approx(frame.value.sum())


def test_archived_run_gives_the_same_rows(results, tmp_path):
    """The same loader on an archived run folder: the same numbers, its LABEL/RUN as run."""
    done = archive.build_run(
        "rocm7.2", results, [cells.CELL], {"rocm7.2": "sha256:" + "c" * 64}, "h",
        archive_root=tmp_path / "archive",
    )  # fmt: skip
    run_dir = tmp_path / "archive" / "rocm7.2" / done.run
    archived = tidy.tidy(run_dir)
    live = tidy.tidy(results)
    assert set(archived.run) == {f"rocm7.2/{done.run}"}
    cols = [c for c in archived.columns if c != "run"]
    pd.testing.assert_frame_equal(archived[cols], live[cols])
    # The archived report carries the run's own tidy table.
    in_report = pd.read_parquet(run_dir / "report" / "tidy.parquet")
    assert len(in_report) == len(archived) and set(in_report.run) == set(archived.run)


def test_live_report_writes_the_tidy_tables(results, tmp_path):
    from cellbench.report import build as report

    files = tidy.stage_files(results, [cells.CELL])
    report.write_report(files, results / "report", results=results)
    written = pd.read_parquet(results / "report" / "tidy.parquet")
    assert len(written) == len(tidy.tidy(results))
    assert len(pd.read_csv(results / "report" / "tidy.csv")) == len(written)


def test_bad_input_is_refused_naming_the_file(results, tmp_path):
    bad = results / cells.CELL / "gsm8k" / "tuned.json"
    data = json.loads(bad.read_text())
    data["strict_match"] = 0.99  # no longer the mean of its per-sample results
    bad.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="gsm8k/tuned.json"):
        tidy.tidy(results)
    with pytest.raises(FileNotFoundError, match="no cell found"):
        tidy.tidy(tmp_path / "results" / "rocm7.2")


def _config_of(tmp_path: Path, models: list[str]) -> str:
    """The embedded default's config with its cells replaced: image rocm7.2, ``models``."""
    config = yaml.safe_load((ROOT / "config/local.yaml").read_text())
    image, model = cells.CELL.split("/")[:2]
    config["images"] = {image: config["images"]["host-cpu"]}
    config["models"] = {name: {"build": "tiny-qwen3-moe", "dtype": "fp16"} for name in models}
    config["cells"] = [{"images": [image], "models": models, "tp": 1}]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_cli_writes_both_files(results, tmp_path, capsys):
    config = _config_of(tmp_path, [cells.CELL.split("/")[1]])
    out = str(tmp_path / "t")
    assert cli.main(["tidy", str(results), "--configfile", config, "--out-dir", out]) == 0
    assert (tmp_path / "t" / "tidy.parquet").is_file() and (tmp_path / "t" / "tidy.csv").is_file()
    assert cli.main(["tidy", str(tmp_path / "nowhere")]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_cli_refuses_live_results_without_a_cell_of_the_config(results, tmp_path, capsys):
    """A cell of the config whose whole folder is gone: no one-cell table that looks whole."""
    config = _config_of(tmp_path, ["tiny-a", "tiny-b"])
    assert cli.main(["tidy", str(results), "--configfile", config]) == 1
    err = capsys.readouterr().err
    assert f"bad result file {results}/rocm7.2/tiny-b/tp1-ep1: (cell folder) = (absent)" in err
    assert f"1 of 2 have none under {results}: rocm7.2/tiny-b/tp1-ep1" in err
    assert f"--configfile {config}" in err and "snakemake all --cores 2" in err
    with pytest.raises(ResultError, match="tiny-b/tp1-ep1"):
        tidy.tidy(results, ["rocm7.2/tiny-b/tp1-ep1"])
    assert cli.main(["tidy", str(results), "--configfile", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
    # The module alone has no config to check live results against: it says so.
    assert tidy.main([str(results)]) == 2
    assert "run it as `cellbench tidy`" in capsys.readouterr().err
