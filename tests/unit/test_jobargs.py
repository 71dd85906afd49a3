"""Tracked and untracked job arguments (cellbench.config.jobargs): what a rule's `settings` param
holds is what Snakemake compares to decide a rerun. The whole-workflow check against a finished
run is tests/workflow/test_pipeline_local.py::test_rerun_trigger_table."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.runtime import pins

ROOT = Path(__file__).resolve().parents[2]
CELL = SimpleNamespace(image="rocm7.2", model="qwen3-30b-a3b-fp8", tp="2", ep="2")
HOST_ONLY = {"--lease-dir", "--ready-timeout", "--total-gpus", "--hf-cache", "--mount"}


@pytest.fixture
def production():
    return cbconfig.load(ROOT / "config/config.yaml")


def _flags(text: str) -> set[str]:
    return {word for word in shlex.split(text) if word.startswith("--")}


def _all_settings(config) -> list[str]:
    p = pins.Pins.for_config(config)
    return [
        jobargs.tune_settings(config, p, CELL),
        jobargs.serve_settings(config, p, CELL, "pair"),
        jobargs.results_hash(config, p, cbconfig.cells(config)),
    ]


def test_settings_hold_no_host_detail(production):
    p = pins.Pins.for_config(production)
    serve = jobargs.serve_settings(production, p, CELL, "pair")
    assert not _flags(serve) & HOST_ONLY
    assert {"--grid-json", "--repeats", "--gsm8k-fewshot", "--image-digest", "--gpus"} <= _flags(
        serve
    )
    host = jobargs.serve_host(production, SimpleNamespace(keys=lambda: [], tuned=None))
    assert _flags(host) <= HOST_ONLY
    tune = jobargs.tune_settings(production, p, CELL)
    assert "--total-gpus" not in tune and "lease" not in tune and "huggingface" not in tune


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("serve", "ready_timeout_s", 7), ("gpus", None, 2), ("hf_cache", None, "/elsewhere")],
)
def test_host_settings_change_no_tracked_value(production, section, key, value):
    edited = copy.deepcopy(production)
    if key is None:
        edited[section] = value
    else:
        edited[section][key] = value
    assert _all_settings(edited) == _all_settings(production)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("serve", "grid", [{"isl": 8, "osl": 8}]),
        ("serve", "repeats", 9),
        ("serve", "ignore_eos", False),
        ("gsm8k", "num_fewshot", 0),
        ("gsm8k", "limit", 3),
        ("tune", "mode", "exhaustive"),
        ("tune", "code_version", "x"),
    ],
)
def test_shaping_settings_change_the_tracked_values(production, section, key, value):
    edited = copy.deepcopy(production)
    edited[section][key] = value
    before, after = _all_settings(production), _all_settings(edited)
    assert after[2] != before[2]  # the archive's settings hash
    assert after[0] != before[0] or after[1] != before[1]
