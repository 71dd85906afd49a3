"""Stage jobs as the rules hand them over: tests build a job (a dict of the stage's typed
fields) and pass it the way the workflow does, ``--job JSON``, instead of writing flag lists.

Tune: a ``TuneJob``'s fields (``cellbench.tune.job``); the embedded default's own job comes
from ``cellbench.config.jobargs.tune_job``. Serve: a ``StageConfig``'s fields
(``cellbench.serve.job``), built from a config by ``jobargs.serve_job``/``compare_job``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# stdlib only (not cellbench.config, which needs jsonschema): the tuner's tests also run where
# only the image's packages are, e.g. on a GPU machine
from cellbench.common.canonical import canonical as _canonical
from cellbench.tune.job import TuneJob


def tune_job(model_config: Path | str, **fields: Any) -> dict[str, Any]:
    """A tune job for a model config, other fields at TuneJob's defaults unless given;
    checked here, so a test's typo fails at the test and not as the tuner's refusal."""
    job = {"model_config": str(model_config), **fields}
    TuneJob.from_job(job)
    return job


def tune_argv(job: dict[str, Any], out: Path | str) -> list[str]:
    """The tuner's arguments as the tune rule gives them (``--job`` canonical JSON, ``--out``)."""
    return ["--job", _canonical(job), "--out", str(out)]


def run_tuner(job: dict[str, Any], out: Path | str) -> int:
    """``python -m cellbench.tune`` in this process, on a job: its exit status."""
    from cellbench.tune import cli

    return cli.main(tune_argv(job, out))


def serve_argv(job: dict[str, Any], host: dict[str, Any], out_dir: Path | str) -> list[str]:
    """The serve stage's arguments as the serve rules give them."""
    return ["--job", _canonical(job), "--host", json.dumps(host), "--out-dir", str(out_dir)]
