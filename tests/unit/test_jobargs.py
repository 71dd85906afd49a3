"""Tracked and untracked job arguments (cellbench.config.jobargs): what a rule's `settings` param
holds is what Snakemake compares to decide a rerun. The whole-workflow check against a finished
run is tests/workflow/test_pipeline_local.py::test_rerun_trigger_table."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.report.percentile_claims import parse_bounds
from cellbench.runtime import pins

ROOT = Path(__file__).resolve().parents[2]
CELL = SimpleNamespace(image="rocm7.2", model="qwen3-30b-a3b-fp8", tp="2", ep="2")
HOST_KEYS = {"lease_dir", "ready_timeout_s", "total_gpus", "hf_cache", "vllm_python"}


@pytest.fixture
def production():
    return cbconfig.load(ROOT / "config/config.yaml")


def _all_settings(config) -> list[str]:
    p = pins.Pins.for_config(config)
    return [
        jobargs.tune_settings(config, p, CELL),
        jobargs.serve_settings(config, p, CELL, "pair"),
        jobargs.results_hash(config, p, cbconfig.cells(config)),
    ]


def test_settings_hold_no_host_detail(production):
    p = pins.Pins.for_config(production)
    serve = json.loads(jobargs.serve_settings(production, p, CELL, "pair"))
    assert not set(serve) & HOST_KEYS
    assert {"grid", "repeats", "gsm8k_fewshot", "image_digest", "gpus"} <= set(serve)
    host = json.loads(jobargs.serve_host(production, SimpleNamespace(keys=lambda: [], tuned=None)))
    assert set(host) <= HOST_KEYS
    tune = json.loads(jobargs.tune_settings(production, p, CELL))
    assert not set(tune) & (HOST_KEYS | {"lease_dir", "mount", "out"})
    assert "huggingface" not in json.dumps(tune)
    assert {"model_config", "tp", "ep", "mode", "batch_sizes", "image_digest", "gpus"} <= set(tune)


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
        ("tune", "batch_sizes", [1, 2]),
        ("tune", "max_configs", 4),
        ("tune", "backend", "builtin"),
    ],
)
def test_shaping_settings_change_the_tracked_values(production, section, key, value):
    edited = copy.deepcopy(production)
    edited[section][key] = value
    before, after = _all_settings(production), _all_settings(edited)
    assert after[2] != before[2]  # the archive's settings hash
    assert after[0] != before[0] or after[1] != before[1]


def test_serve_settings_are_the_job_as_canonical_json(production):
    """params.settings is the stage's job itself, byte-stable (keys sorted, no spaces), and
    the stage reads it, with params.host, into the one typed object it runs."""
    from cellbench.serve.args import parse_args
    from cellbench.serve.job import StageConfig

    p = pins.Pins.for_config(production)
    settings = jobargs.serve_settings(production, p, CELL, "untuned")
    job = json.loads(settings)
    assert settings == json.dumps(job, sort_keys=True, separators=(",", ":"))
    assert settings == jobargs.serve_settings(copy.deepcopy(production), p, CELL, "untuned")
    host = jobargs.serve_host(production, SimpleNamespace(keys=lambda: [], tuned=None))
    job["gsm8k"] = False  # no question file on this host
    job["image_ref"] = "r@sha256:" + "0" * 64  # the production config's images are not locked
    cfg = parse_args(["--job", json.dumps(job), "--host", host, "--out-dir", "out"])
    assert cfg == StageConfig.from_job({**job, **json.loads(host), "out_dir": "out"})
    assert (cfg.grid, cfg.repeats, cfg.tp, cfg.ep) == (
        production["serve"]["grid"],
        production["serve"]["repeats"],
        2,
        2,
    )
    assert cfg.ready_timeout_s == production["serve"]["ready_timeout_s"]


def test_every_serve_key_but_the_hosts_is_the_jobs(production):
    """A new serve setting needs no line here: the section's keys go into the job as they
    are, but for the host's and the rules' own, and each is a StageConfig field."""
    from dataclasses import fields

    from cellbench.serve.job import StageConfig

    p = pins.Pins.for_config(production)
    job = jobargs.serve_job(production, p, CELL, "pair")
    skipped = set(jobargs.SERVE_HOST_KEYS) | set(jobargs.SERVE_RULE_KEYS)
    assert not production["serve"]["request_rates"]  # then these two shape nothing
    skipped |= {"request_rate_prompts", "burstiness"}
    skipped |= {"starts"}  # the job's starts_min and starts_cap
    assert (job["starts_min"], job["starts_cap"]) == tuple(production["serve"]["starts"].values())
    assert set(production["serve"]) - skipped <= set(job)
    assert set(job) <= {f.name for f in fields(StageConfig)}
    assert set(jobargs.SERVE_HOST_KEYS) <= {f.name for f in fields(StageConfig)}


def test_the_plans_assumptions_shape_no_tracked_setting(production):
    """Issue 32 item 4: `plan` feeds only `cellbench plan`'s estimate, so editing it reruns
    no job (no tune or serve params, no archive hash change)."""
    before = _all_settings(production)
    production["plan"] = {**production["plan"], "tpot_ms": 1.0, "server_start_s": 9.0}
    assert _all_settings(production) == before


def test_latency_bounds_change_the_reports_settings_only(production):
    """Issue 32 item 5: the bounds are read by the report alone. Editing them changes the
    report rule's tracked settings and no tune or serve params nor the archive's hash; a config
    without bounds keeps the report's settings as they were before bounds existed, so a
    finished run reruns nothing for the upgrade."""
    before, report_before = _all_settings(production), jobargs.report_settings(production)
    assert report_before == f"--min-change-pct {production['report']['min_change_pct']}"
    production["report"]["latency_bounds"] = {"percentile": 99, "ttft_ms": 2000, "points": []}
    assert _all_settings(production) == before
    with_bounds = jobargs.report_settings(production)
    assert with_bounds != report_before
    production["report"]["latency_bounds"]["ttft_ms"] = 3000
    assert _all_settings(production) == before
    assert jobargs.report_settings(production) not in (with_bounds, report_before)
    # the flag's value reaches the report as the config's section, intact through the shell
    words = shlex.split(jobargs.report_settings(production))
    assert words[2] == "--latency-bounds"
    assert parse_bounds(words[3])["ttft_ms"] == 3000


def test_tune_settings_are_the_job_as_canonical_json(production):
    """params.settings of the tune rule is the tuner's job itself, byte-stable, and the tuner
    reads it (the rule's `--job {params.settings:q}`) into the one typed object it runs."""
    from cellbench.tune.job import TuneJob
    from cellbench.tune.plan import job_from_argv

    p = pins.Pins.for_config(production)
    settings = jobargs.tune_settings(production, p, CELL)
    job = json.loads(settings)
    assert settings == jobargs.canonical(job)
    assert settings == jobargs.tune_settings(copy.deepcopy(production), p, CELL)
    tune, out = job_from_argv(["--job", settings, "--out", "results/x/tune"])
    assert (tune, out) == (TuneJob.from_job(job), "results/x/tune")
    model = production["models"][CELL.model]
    assert (tune.tp, tune.ep, tune.expert_parallel) == (2, 2, True)
    assert (tune.dtype, tune.block_shape) == (model["dtype"], model["block_shape"])
    assert (tune.mode, tune.batch_sizes) == (
        production["tune"]["mode"],
        production["tune"]["batch_sizes"],
    )
    assert tune.env == jobargs.cell_env(production, CELL)


def test_every_tune_key_but_the_configs_rules_is_the_jobs(production):
    """A new tune setting needs no line in jobargs: the section's keys go into the job as
    they are, but for those of the configs rule, and each is a TuneJob field."""
    from dataclasses import fields

    from cellbench.tune.job import TuneJob

    job = jobargs.tune_job(production, pins.Pins.for_config(production), CELL)
    assert set(production["tune"]) - set(jobargs.TUNE_RULE_KEYS) <= set(job)
    assert set(job) <= {f.name for f in fields(TuneJob)}


@pytest.mark.parametrize(("key", "value"), [("keep", "improved"), ("min_improvement_pct", 9)])
def test_the_configs_rules_tune_keys_rerun_no_tune(production, key, value):
    """tune.keep and tune.min_improvement_pct choose what results/configs/ gathers: editing
    them reruns the configs job (configs_settings), not the tune jobs."""
    p = pins.Pins.for_config(production)
    cells = cbconfig.cells(production)
    edited = copy.deepcopy(production)
    edited["tune"][key] = value
    assert jobargs.tune_settings(edited, p, CELL) == jobargs.tune_settings(production, p, CELL)
    assert jobargs.configs_settings(edited, p, cells) != jobargs.configs_settings(
        production, p, cells
    )


def test_unquantised_models_tune_in_their_own_dtype(production):
    """A float model's job names no weight dtype (vLLM's file name has none for bf16/fp16)
    and computes in the model's dtype."""
    production["models"][CELL.model].update(dtype="bf16", block_shape=None)
    job = jobargs.tune_job(production, pins.Pins.for_config(production), CELL)
    assert (job["dtype"], job["act_dtype"], job["block_shape"]) == ("none", "bf16", None)
