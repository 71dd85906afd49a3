"""The tuned file keeps only picks that beat the baseline unless asked otherwise, and says which
(issue 30, item 6).

``apply_keep`` is checked on entries shaped as the tuner writes them (the timings chosen, so
each case is known); one real tuner run (Triton interpreter, the embedded default's shape,
M = 1) checks the summary records the rule and every entry's ``kept``, and that the tuned
file the loader reads agrees with the summary."""

from __future__ import annotations

import copy
import json

import pytest
from cellbench.results import loaders
from cellbench.tune import outputs
from support.stage_jobs import run_tuner, tune_job

PICK = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 2}  # fmt: skip
BASE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
        "num_warps": 4, "num_stages": 3}  # fmt: skip


def _entry(gain, base_config=BASE):
    return {
        "config": dict(PICK),
        "config_name": "BM16_BN32",
        "time_us": 50.0,
        "gemm1_us": 20.0,
        "kernel_path": "decode",
        "path_choice": {"path": "decode"},
        "roofline": {
            "fused": {
                "roofline_fraction": 0.1,
                "achieved_flops_per_s": 1.0,
                "achieved_bytes_per_s": 1.0,
            }
        },  # fmt: skip
        "baseline": {
            "source": "default",
            "config": dict(base_config),
            "time_us": 48.0,
            "tuned_time_us": 50.0,
        },  # fmt: skip
        "improvement_pct": gain,
    }


def test_a_slower_pick_gives_way_to_the_baseline_and_is_kept_aside():
    entries = {"1": _entry(-4.2), "4": _entry(7.5), "16": _entry(None), "64": _entry(0.0)}
    swapped = outputs.apply_keep(entries, "beats-baseline")
    assert swapped == [1, 64]
    one = entries["1"]
    assert one["kept"] == "baseline" and one["config"] == BASE
    assert one["tuned_pick"]["config"] == PICK and one["tuned_pick"]["time_us"] == 50.0
    assert one["time_us"] == 48.0 and "path_choice" not in one and "gemm1_us" not in one
    assert one["config_name"] == "vllm_default_config"
    assert entries["4"]["kept"] == "pick" and entries["4"]["config"] == PICK
    assert entries["16"]["kept"] == "pick"  # no baseline timed: nothing to compare


def test_keep_all_keeps_every_pick_and_says_which_were_slower():
    entries = {"1": _entry(-4.2), "4": _entry(7.5)}
    before = copy.deepcopy(entries)
    assert outputs.apply_keep(entries, "all") == []
    assert [e["config"] for e in entries.values()] == [e["config"] for e in before.values()]
    assert entries["1"]["kept"] == "pick (not faster than the baseline; --keep all)"


def test_a_baseline_without_all_six_keys_is_not_written():
    partial = {k: v for k, v in BASE.items() if k not in ("num_warps", "num_stages")}
    entries = {"1": _entry(-1.0, partial)}
    assert outputs.apply_keep(entries, "beats-baseline") == []
    assert entries["1"]["config"] == PICK and "not a whole one" in entries["1"]["kept"]


@pytest.mark.slow
def test_a_real_run_records_the_rule_and_the_file_agrees(tmp_path, capsys):
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 8,
                                 "moe_intermediate_size": 32, "hidden_size": 64,
                                 "num_experts_per_tok": 2}))  # fmt: skip
    out = tmp_path / "tune"
    rc = run_tuner(tune_job(model, tp=1, batch_sizes=[1], max_configs=2), out)
    assert rc == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["keep"] == "beats-baseline"
    entry = summary["entries"]["1"]
    assert entry["kept"] in ("pick", "baseline")
    assert (entry["kept"] == "baseline") == (summary["kept_baseline"] == [1])
    if entry["kept"] == "baseline":
        assert entry["config"] == {k: v for k, v in entry["baseline"]["config"].items()
                                   if k in outputs._VLLM_KEYS + outputs._ROCM_KEYS}  # fmt: skip
    # The loader checks the vLLM file holds exactly the summary's configs.
    assert loaders.load_tune(out / "summary.json").data["entries"]["1"]["config"] == entry["config"]
