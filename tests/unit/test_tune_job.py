"""The tune stage's typed job (cellbench.tune.job.TuneJob): the one way in checks the job's
structure and the limits of the fields no config supplies; the config's own limits are the
schema's (tests/unit/test_jobargs.py builds jobs from configs)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from cellbench.tune import job as tune_job
from cellbench.tune.job import JobError, TuneJob


def test_every_field_has_a_type_rule():
    """A new field without a line in _TYPES would be taken unchecked (a KeyError at best)."""
    assert set(tune_job._TYPES) == {f.name for f in fields(TuneJob)}


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ([], "must be a JSON object of fields"),
        ({"model_config": "m", "ep": True}, "ep = True: expected an integer"),
        ({"model_config": "m", "block_shape": [1, 2, 3]}, "block_shape = [1, 2, 3]: expected"),
        ({"model_config": "m", "env": {"A": 1}}, "env = {'A': 1}: expected an object of strings"),
        ({"model_config": "m", "compile_budget": "lots"}, "--compile-budget='lots': expected"),
        ({"model_config": "m", "compile_workers": -1}, "--compile-workers=-1 must be >= 0"),
        ({"model_config": "m", "keep": "some"}, "--keep 'some': expected one of"),
        ({"model_config": "m", "device_name": "a/b"}, "--device-name 'a/b': it becomes part"),
        ({"model_config": "m", "time_budget_s": float("inf")}, "--time-budget-s=inf must be"),
        # a hand --job skips the config schema, so the tuner's choices are checked here too
        ({"model_config": "m", "mode": "bogus"}, "mode = 'bogus': expected one of default, exh"),
        ({"model_config": "m", "backend": "aiter"}, "backend = 'aiter': expected one of builtin"),
    ],
)
def test_refusals_name_the_key_and_what_it_expects(job, message):
    with pytest.raises(JobError) as e:
        TuneJob.from_job(job)
    assert message in str(e.value)


def test_a_job_round_trips_through_its_fields():
    job = {"model_config": "m", "tp": 2, "ep": 2, "batch_sizes": "aiter16", "gpus": 2,
           "env": {"X": "1"}, "compile_budget": [4, 2], "time_budget_s": 30}  # fmt: skip
    made = TuneJob.from_job(job)
    assert made.expert_parallel and made.batch_sizes == "aiter16" and made.env == {"X": "1"}
    assert TuneJob.from_job({f.name: getattr(made, f.name) for f in fields(TuneJob)}) == made
