"""Tuned configs per ROCm version and device (issue 19 item 5), from real tuner runs.

The tuner runs on the embedded default's tiny shape under the Triton CPU interpreter (real
kernels, real timings); its summaries must record a measured baseline per batch size, and
cellbench.configs.collect gathers its files into a folder that vLLM's lookup (here the
project's restatement of it, kernels.config_lookup) reads as VLLM_TUNED_CONFIG_FOLDER.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench.common import atomicio
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig  # noqa: E402
from cellbench.configs import collect as ca  # noqa: E402
from cellbench.contracts import result_file  # noqa: E402
from cellbench.results import loaders  # noqa: E402
from cellbench.runtime import pins
from cellbench.tune import cli  # noqa: E402
from cellbench.tune.kernels import config_lookup  # noqa: E402
from cellbench.tune.shapes import MoEShape  # noqa: E402
from support import result_fixtures as rf  # noqa: E402
from support.tiny_moe import TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CELL_A = "host-cpu/tiny/tp1-ep1"
CELL_B = "host-cpu-b/tiny/tp1-ep1"
IMAGES = {
    "host-cpu": {"digest": "local:python3.12", "rocm_version": None},
    "host-cpu-b": {"digest": "local:python3.12", "rocm_version": None},
}


def _tune(model_cfg: Path, out: Path, *extra: str) -> dict:
    rc = cli.main(
        ["--model-config", str(model_cfg), "--tp", "1", "--max-configs", "3", *extra]
        + ["--out", str(out)]
    )
    assert rc == 0
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """One real tuner run (M = 1, 4, 16) as cell A's tune job left it."""
    root = tmp_path_factory.mktemp("tuned")
    model_cfg = root / "config.json"
    model_cfg.write_text(json.dumps(TINY))
    results_dir = root / "results"
    _tune(model_cfg, results_dir / CELL_A / "tune", "--batch-sizes", "1,4,16")
    return results_dir


def _copy_results(src: Path, dst: Path, cells: list[str]) -> Path:
    for cell in cells:
        shutil.copytree(src / CELL_A, dst / cell)
    return dst


def test_tuner_records_a_measured_baseline_per_batch_size(tuned: Path) -> None:
    summary = loaders.load_tune(tuned / CELL_A / "tune" / "summary.json", tuned).data
    shape = MoEShape(**{k: summary["shape"][k] for k in
                        ("num_experts", "intermediate_size", "hidden_size", "topk")})  # fmt: skip
    assert summary["tuner_version"]
    for key, entry in summary["entries"].items():
        base = entry["baseline"]
        # no --seed-configs and no vLLM file for this device: vLLM's default rule
        assert base["source"] == "default"
        assert base["config"] == config_lookup.default_config(
            int(key), shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.topk
        )
        assert base["method"] == entry["timing_method"]  # the winner's timing method
        assert base["time_us"] > 0 and base["tuned_time_us"] > 0
        if base["same_as_tuned"]:
            assert entry["improvement_pct"] == 0.0
        else:
            gain = 100 * (base["time_us"] - base["tuned_time_us"]) / base["time_us"]
            assert entry["improvement_pct"] == pytest.approx(gain)


def test_seed_table_is_the_shipped_baseline(tmp_path) -> None:
    model_cfg = tmp_path / "config.json"
    model_cfg.write_text(json.dumps(TINY))
    seed = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 2}  # fmt: skip
    table = tmp_path / "shipped.json"
    table.write_text(json.dumps({"triton_version": "3.6.0", "1": seed}))
    out = tmp_path / "c" / "tune"
    summary = _tune(model_cfg, out, "--batch-sizes", "4", "--seed-configs", str(table))
    base = summary["entries"]["4"]["baseline"]
    assert base["source"] == "shipped" and base["config"] == seed
    assert base["path"] == str(table.resolve())
    assert base["time_us"] > 0


def test_old_summary_loads_without_a_baseline_and_a_wrong_gain_is_refused(tmp_path, tuned):
    old = rf.write_tune(tmp_path, CELL_A)
    entry = loaders.load_tune(old, tmp_path).data["entries"]["1"]
    assert loaders.baseline_of(entry) is None

    path = tmp_path / "x" / CELL_A / "tune" / "summary.json"
    shutil.copytree(tuned / CELL_A / "tune", path.parent)
    data = json.loads(path.read_text())
    data["entries"]["1"]["improvement_pct"] = 99.0
    data["entries"]["1"]["baseline"]["same_as_tuned"] = False
    atomicio.write_json(path, data, checksum=True)
    with pytest.raises(result_file.ResultError, match=r"entries\['1'\]\.improvement_pct"):
        loaders.load_tune(path, tmp_path / "x")


def test_gathered_folder_is_a_vllm_tuned_config_folder(tuned, tmp_path, monkeypatch) -> None:
    res = _copy_results(tuned, tmp_path / "results", [CELL_A, CELL_B])
    out = tmp_path / "configs" / "embedded-cpu"
    index = ca.write(res, [CELL_A, CELL_B], out, label="embedded-cpu", images=IMAGES)
    assert json.loads((out / "INDEX.json").read_text()) == json.loads(json.dumps(index))

    summary = json.loads((res / CELL_A / "tune" / "summary.json").read_text())
    device = out / summary["device_name"]
    cell_file = res / CELL_A / "tune" / "configs" / summary["config_file"]
    # Only vLLM JSON files at the top level, named as vLLM names them, byte for byte the cell's.
    top = sorted(p.name for p in device.iterdir() if p.is_file())
    s = summary["shape"]
    name = config_lookup.config_file_name(
        s["num_experts"], s["intermediate_size"], device=summary["device_name"]
    )
    assert top == [name] == [summary["config_file"]]
    assert (device / name).read_bytes() == cell_file.read_bytes()
    # The project's own format check, on the cell's file whose checksum vouches for these
    # bytes (the gathered folder holds vLLM's files only, no sidecar).
    loaders.load_vllm_config(cell_file)

    monkeypatch.setenv(config_lookup.ENV_FOLDER, str(device))
    config_lookup.clear_cache()
    try:
        found = config_lookup.resolve(s["num_experts"], s["intermediate_size"],
                                      device=summary["device_name"])  # fmt: skip
        assert found.path == str(device / name)
        assert config_lookup.read_table(found.path) == config_lookup.read_table(cell_file)
        for m, e in summary["entries"].items():
            assert config_lookup.lookup(int(m), s["num_experts"], s["intermediate_size"],
                                        s["hidden_size"], s["topk"],
                                        device=summary["device_name"]) == e["config"]  # fmt: skip
    finally:
        config_lookup.clear_cache()

    manifest = json.loads((device / "cellbench" / "MANIFEST.json").read_text())
    # Same name, same content: one file, both cells recorded.
    assert manifest["configs"][name]["cells"] == [CELL_B, CELL_A]
    for rel, digest in manifest["files"].items():
        assert atomicio.sha256_file(device / rel) == digest
    assert set(manifest["files"]) == {name, "cellbench/tuned_fmoe.csv"}
    entries = manifest["configs"][name]["entries"]
    for m, e in summary["entries"].items():
        rec = entries[m]["cells"][CELL_A]
        assert rec["improvement_pct"] == e["improvement_pct"]
        assert rec["beat_baseline"] == (e["improvement_pct"] >= 3.0)
    assert manifest["cells"][CELL_A]["triton_version"] == summary["triton_version"]
    assert manifest["git"]["commit"]
    # AITER rows: one per shape and token (the second cell's identical shape is not repeated)
    with open(device / "cellbench" / "tuned_fmoe.csv", newline="") as f:
        tokens = [int(r["token"]) for r in csv.DictReader(f)]
    assert tokens == sorted(int(m) for m in summary["entries"])


def test_collision_names_both_cells_and_keys_before_writing(tuned, tmp_path) -> None:
    res = _copy_results(tuned, tmp_path / "results", [CELL_A, CELL_B])
    out = tmp_path / "configs" / "embedded-cpu"
    ca.write(res, [CELL_A, CELL_B], out, label="embedded-cpu", images=IMAGES)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    # Cell B retuned differently: the same file name with another config at one batch size.
    path = res / CELL_B / "tune" / "summary.json"
    summary = json.loads(path.read_text())
    m = next(iter(summary["entries"]))
    cfg = summary["entries"][m]["config"]
    cfg["BLOCK_SIZE_K"] = 128 if cfg["BLOCK_SIZE_K"] != 128 else 64
    vllm_file = res / CELL_B / "tune" / "configs" / summary["config_file"]
    table = json.loads(vllm_file.read_text())
    table[m] = cfg
    atomicio.write_text(vllm_file, json.dumps(table, indent=4) + "\n", checksum=True)
    atomicio.write_json(path, summary, checksum=True)

    with pytest.raises(ca.ConfigCollision) as err:
        ca.write(res, [CELL_A, CELL_B], out, label="embedded-cpu", images=IMAGES)
    text = str(err.value)
    assert CELL_A in text and CELL_B in text and summary["config_file"] in text
    assert f"M={m} BLOCK_SIZE_K" in text
    # nothing written: the earlier folder is as it was, and no staging folder is left
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_keep_improved_drops_entries_below_the_threshold(tuned, tmp_path) -> None:
    summary = json.loads((tuned / CELL_A / "tune" / "summary.json").read_text())
    gains = {int(m): e["improvement_pct"] for m, e in summary["entries"].items()}
    # just above the smallest gain: that entry goes, entries at or above the threshold stay
    threshold = max(min(gains.values()) + 1e-6, 0.0)
    kept = sorted(m for m, g in gains.items() if g >= threshold)
    out = tmp_path / "configs" / "x"
    ca.write(tuned, [CELL_A], out, label="x", images=IMAGES, keep="improved",
             min_improvement_pct=threshold)  # fmt: skip
    device = out / summary["device_name"]
    manifest = json.loads((device / "cellbench" / "MANIFEST.json").read_text())
    rec = manifest["configs"][summary["config_file"]]
    assert [int(m) for m, e in rec["entries"].items() if e["kept"]] == kept
    if kept:
        table = config_lookup.read_table(device / summary["config_file"])
        assert sorted(table) == kept
        assert all(table[m] == summary["entries"][str(m)]["config"] for m in kept)
        with open(device / "cellbench" / "tuned_fmoe.csv", newline="") as f:
            assert sorted(int(r["token"]) for r in csv.DictReader(f)) == kept
    else:
        assert not (device / summary["config_file"]).exists() and rec["why_not_written"]

    # Nothing beats a threshold above every gain: the file is not written, the manifest says so.
    out2 = tmp_path / "configs" / "y"
    ca.write(tuned, [CELL_A], out2, label="y", images=IMAGES, keep="improved",
             min_improvement_pct=max(max(gains.values()), 0.0) + 1.0)  # fmt: skip
    device2 = out2 / summary["device_name"]
    assert [p.name for p in device2.iterdir()] == ["cellbench"]
    rec2 = json.loads((device2 / "cellbench" / "MANIFEST.json").read_text())
    assert rec2["configs"][summary["config_file"]]["written"] is False
    assert "keep: improved" in rec2["configs"][summary["config_file"]]["why_not_written"]


def test_summary_without_baseline_counts_as_not_improved(tmp_path) -> None:
    rf.write_tune(tmp_path, CELL_A)
    out = tmp_path / "configs" / "x"
    ca.write(tmp_path, [CELL_A], out, label="x", images=IMAGES)  # keep: all writes it
    device = out / "CPU_TRITON_INTERPRET"
    assert (device / rf.CONFIG_FILE).exists()
    manifest = json.loads((device / "cellbench" / "MANIFEST.json").read_text())
    cell = manifest["configs"][rf.CONFIG_FILE]["entries"]["1"]["cells"][CELL_A]
    assert cell["beat_baseline"] is None and "no baseline recorded" in cell["note"]
    ca.write(tmp_path, [CELL_A], out, label="x", images=IMAGES, keep="improved")
    assert not (device / rf.CONFIG_FILE).exists()


def test_bad_input_is_refused_before_writing(tmp_path) -> None:
    out = tmp_path / "configs" / "x"
    with pytest.raises(ca.ConfigsError, match="host-cpu/none/tp1-ep1"):
        ca.write(tmp_path, ["host-cpu/none/tp1-ep1"], out, label="x", images=IMAGES)
    with pytest.raises(ca.ConfigsError, match="keep='some'"):
        ca.write(tmp_path, [CELL_A], out, label="x", images=IMAGES, keep="some")
    assert not out.exists()


def test_keep_and_threshold_are_tracked_by_the_configs_job_only() -> None:
    config = cbconfig.load(ROOT / "config" / "config.yaml")
    assert (config["tune"]["keep"], config["tune"]["min_improvement_pct"]) == ("all", 3)
    p = pins.Pins.for_config(config)
    cells = cbconfig.cells(config)
    rocm72 = [c for c in cells if cbconfig.archive_label(config, c.image) == "rocm7.2"]
    base = jobargs.configs_settings(config, p, rocm72)
    assert json.loads(base)["images"]["rocm7.2"]["rocm_version"] == "7.2"
    for key, value in (("keep", "improved"), ("min_improvement_pct", 5)):
        edited = copy.deepcopy(config)
        edited["tune"][key] = value
        assert jobargs.configs_settings(edited, p, rocm72) != base
        # the tune and serve jobs' tracked values do not change: no cell is retuned or served
        for c in cells:
            assert jobargs.tune_settings(edited, p, c) == jobargs.tune_settings(config, p, c)
            assert jobargs.serve_settings(edited, p, c, "pair") == jobargs.serve_settings(
                config, p, c, "pair"
            )
