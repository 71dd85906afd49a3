"""The tune stage's job: what one tune job tunes and how (``TuneJob``), built by
``TuneJob.from_job`` from the dict the rule writes (``cellbench.config.jobargs.tune_job``, as
canonical JSON) or from the hand command line (``cellbench.tune.plan``).

In-container module: stdlib only.

A new tune setting is a key of the config schema's ``tune`` section, a field here of the same
name, and the code that reads it: ``tune_job`` copies the section's keys as they are.

The limits of the settings a config supplies (tp, ep, batch sizes, mode, backend, dtype, block
shape, max_configs) are checked where the config enters (the schema and
``cellbench.config.loader``), and for the hand command line in ``plan.py`` (its flag check); what is
checked here is the job's structure, and the limits of the fields only a person gives (time
budget, compile workers, compile budget, device name, keep rule).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from cellbench.tune.shapes import DEVICE_NAME_RE, DEVICE_NAME_RULE

KEEP_CHOICES = ("beats-baseline", "all")
# The tuner's own choices: a job given by hand (--job) reaches the tuner without the config
# schema, so these are checked here too, and the hand flags offer the same.
MODES = ("default", "exhaustive")
BACKENDS = ("builtin", "vllm")


class JobError(ValueError):
    """A job that does not fit ``TuneJob`` (exit status 2)."""


@dataclass(frozen=True)
class TuneJob:
    """One tune job, checked before any model config is read or any GPU is touched."""

    # What is tuned (the cell and the config's tune section).
    model_config: str  # config.json, a model folder or a hub id
    tp: int = 1
    ep: int = 1  # the expert-parallel size: 1 (off) or tp (on), as in the cell's folder name
    dtype: str = "auto"  # fp8_w8a8, none (unquantised), a float dtype, or auto
    act_dtype: str | None = None  # the compute dtype (bf16 | fp16 | fp32); None: by device
    block_shape: Any = "auto"  # "auto", None, or [n, k]
    batch_sizes: Any = "vllm_default"  # a tier's name or a list of batch sizes
    mode: str = "default"
    backend: str = "builtin"
    max_configs: int = 0  # 0: no cap
    # Where the rule runs it (tracked so that a change reruns the job; the step sets them up).
    runtime: str | None = None
    image_digest: str | None = None
    gpu_vendor: str | None = None
    gpus: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # the cell's variables, set by the step
    code_version: str | None = None  # bumped in the config to retune every cell
    # Only given by hand (benchmarks, tests, a person at a GPU).
    seed: int = 0
    device_name: str | None = None
    compile_workers: int | None = None  # None: by the machine's CPUs per GPU
    compile_budget: Any = "auto"  # "auto", "none" (no limit) or [first, later]
    seed_configs: str | None = None
    time_budget_s: float | None = None
    keep: str = "beats-baseline"
    vllm_source: str | None = None

    @classmethod
    def from_job(cls, job: Any) -> TuneJob:
        """The one way in; JobError names the key and what it expects."""
        if not isinstance(job, dict):
            raise JobError(f"a tune job must be a JSON object of fields, got {job!r}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(job) - set(known))
        if unknown:
            raise JobError(
                f"unknown tune job key(s) {', '.join(unknown)} (known: {', '.join(known)})"
            )
        missing = [n for n, f in known.items() if _required(f) and n not in job]
        if missing:
            raise JobError(f"tune job: missing key(s) {', '.join(missing)}")
        for name, value in job.items():
            _check_type(name, value)
        made = cls(**job)
        made._check_hand_fields()
        return made

    def _check_hand_fields(self) -> None:
        """Limits of the fields no config supplies, so nothing has checked them yet."""
        if self.device_name is not None and not DEVICE_NAME_RE.match(self.device_name):
            raise JobError(
                f"--device-name {self.device_name!r}: it becomes part of a file name, so it "
                f"may hold only {DEVICE_NAME_RULE}"
            )
        budget = self.time_budget_s
        if budget is not None and not (math.isfinite(budget) and budget > 0):
            raise JobError(
                f"--time-budget-s={budget:g} must be a number of seconds > 0 (leave it out for "
                "no budget); a run with none left would tune nothing"
            )
        if self.compile_workers is not None and self.compile_workers < 0:
            raise JobError(f"--compile-workers={self.compile_workers} must be >= 0")
        cb = self.compile_budget
        if isinstance(cb, list) and (len(cb) != 2 or min(cb) < 1):
            raise JobError(f"--compile-budget={cb}: expected two numbers FIRST,LATER, both >= 1")
        if isinstance(cb, str) and cb not in ("auto", "none"):
            raise JobError(f"--compile-budget={cb!r}: expected FIRST,LATER, none or auto")
        if self.keep not in KEEP_CHOICES:
            raise JobError(f"--keep {self.keep!r}: expected one of {', '.join(KEEP_CHOICES)}")

    @property
    def expert_parallel(self) -> bool:
        return self.ep > 1


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(x) for x in v)


def _opt(check):
    return lambda v: v is None or check(v)


# What each key's value may be (its type; limits are the config's, see the docstring).
_TYPES = {
    "model_config": ("a non-empty string", lambda v: isinstance(v, str) and bool(v)),
    "tp": ("an integer", _is_int),
    "ep": ("an integer", _is_int),
    "dtype": ("a string", lambda v: isinstance(v, str)),
    "act_dtype": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "block_shape": (
        '"auto", null or [n, k]',
        lambda v: v is None or v == "auto" or (_int_list(v) and len(v) == 2),
    ),
    "batch_sizes": (
        "a tier's name or a non-empty list of integers",
        lambda v: isinstance(v, str) or _int_list(v),
    ),
    "mode": (f"one of {', '.join(MODES)}", lambda v: v in MODES),
    "backend": (f"one of {', '.join(BACKENDS)}", lambda v: v in BACKENDS),
    "max_configs": ("an integer", _is_int),
    "runtime": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "image_digest": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "gpu_vendor": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "gpus": ("null or an integer", _opt(_is_int)),
    "env": (
        "an object of strings",
        lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    ),
    "code_version": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "seed": ("an integer", _is_int),
    "device_name": ("null or a string", _opt(lambda v: isinstance(v, str))),
    "compile_workers": ("null or an integer", _opt(_is_int)),
    "compile_budget": (
        '"auto", "none" or [first, later]',
        lambda v: isinstance(v, str) or _int_list(v),
    ),
    "seed_configs": ("null or a path", _opt(lambda v: isinstance(v, str))),
    "time_budget_s": (
        "null or a number",
        _opt(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    ),
    "keep": ("a string", lambda v: isinstance(v, str)),
    "vllm_source": ("null or a path", _opt(lambda v: isinstance(v, str))),
}


def _check_type(name: str, value: Any) -> None:
    what, ok = _TYPES[name]
    if not ok(value):
        raise JobError(f"tune job: {name} = {value!r}: expected {what}")
