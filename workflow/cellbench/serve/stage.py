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
digests are equal (on the local runtime a digest hashes the server interpreter's package
versions: ``cellbench.runtime.pins.local_digest``).

The job runs in rounds of server starts (``--starts-min``, ``serve.starts.min``): each round
starts a fresh server per side (A B, then B A by round), measures the grid ``--repeats``
times per start, interleaved, and stops them; every point records its ``start``. With
``--starts-cap N`` above the minimum (pair and images jobs) a point gets another round only
while the group-sequential rule (``cellbench.serve.repeat_stop``, at the margin
``--min-change-pct``) leaves its answer open, at most N; each point then records
``starts_used`` and ``stop_reason``.

Each arm's output folder gets:

* ``bench.json``   every point (keys as ``vllm bench serve`` saves them, plus ``repeat``, the
  job-wide sequence number ``seq`` and ``started_at``) and provenance; validated against
  ``workflow/schemas/bench.schema.json``, written atomically and last;
* ``server.log``   the server's output;
* ``lm_eval/``     lm-eval's own output (built as ``lm_eval.partial`` and swapped in at the
  end), the sha256 of each of its files in ``lm_eval.sha256``, and ``lm_eval.log``.

A server (either one, for a pair) that exits during start-up or mid-run, never becomes ready, or
fails more than ``--max-failed-share`` of a point's requests fails the job (exit status 1) with
the tail of its log in the message; every server is stopped and no ``bench.json`` is written:
the arm's previous results, if any, stay as they were, whole, until a run of the job succeeds.

``cold`` is observed, per server, just before it starts: in the docker runtime the server's
per-image cache folder (``--cache-dir``, default ``<lease-dir>/../.cache/<image digest>``,
mounted as vLLM's compile cache and AITER's JIT folder) is counted (``cache_at_start``: files
and bytes) and ``cold`` is true when it held no file. The local runtime's server is given no
cache folder, so there ``cold`` is null. ``tp`` and ``ep`` are the layout the server's own log
states (vLLM's engine-config line, workers and expert-parallel line: ``moe_evidence.
read_parallelism``, kept whole as ``parallel_observed``); where its log states none, they are
read from its command line, and ``tp_source`` says which (``server log``, ``command``, or null
when neither says): the local runtime's ``transformers serve`` logs no layout and has no such
option, it runs the model in one process (``command``: 1 and 1). ``tp_requested``/
``ep_requested`` are the cell's. ``planned_gpu_overlap``: the job gave another side's server
some of the same GPUs (by construction on the local runtime), not an observation.

Usage. The serve and compare rules pass the whole job, a JSON object of ``StageConfig`` fields
(``cellbench.config.jobargs.serve_job``; ``--host`` holds this host's fields, untracked)::

    python -m cellbench.serve --job '{"runtime": "local", "arm": "pair", ...}' \
        --host '{"lease_dir": "results/.leases", ...}' --out-dir DIR

By hand, each field also has a flag (``cellbench.serve.args``); a job's key given twice is
refused::

    python -m cellbench.serve \\
        --runtime local|docker --cell-id IMAGE/MODEL/tpN-epM --arm untuned|tuned|pair|images \\
        --model PATH_OR_HF_ID [--served-model-name NAME] --tp N --ep M \\
        [--image-ref REF] [--image-digest D] [--gpu-vendor amd|nvidia|none] [--gpus N] \\
        [--total-gpus N] [--hf-cache DIR] [--cache-dir DIR] [--lease-dir DIR] \\
        [--serve-args-json '[...]'] [--server-command-json '[...]'] \\
        --grid-json '[{"isl":512,"osl":512}]' --concurrency 1,4 \\
        [--prompts-per-concurrency 10] [--warmups-per-concurrency 2] [--repeats 1] \\
        [--starts-min 1] [--starts-cap N --min-change-pct P] \\
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

import shutil
import sys
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.common.atomicio import write_json
from cellbench.contracts import request_detail, result_file
from cellbench.runtime import interrupts
from cellbench.serve import (
    loadgen,
    moe_evidence,
)
from cellbench.serve.args import parse_args
from cellbench.serve.job import IMAGES, Side, StageConfig
from cellbench.serve.measure import _measure, _shared_gpus
from cellbench.serve.server import (
    ServerError,
    log_tail,
    observe_model_origin,
)


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


def observed_parallelism(
    command: list[str], log_path: Path, *, one_process: bool
) -> dict[str, Any]:
    """``tp``/``ep`` as the server's log states them, else as its command line says, with
    ``tp_source`` naming which; ``world_size`` and the whole log reading beside them."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    seen = moe_evidence.read_parallelism(text)
    from_command = applied_parallelism(command, one_process=one_process)
    if seen["source"] is not None:
        tp, ep, source = seen["tp"], seen["ep"], "server log"
    elif from_command["tp"] is not None:
        tp, ep, source = from_command["tp"], from_command["ep"], "command"
    else:
        tp, ep, source = None, None, None
    return {
        "tp": tp,
        "ep": ep,
        "tp_source": source,
        "world_size": seen["world_size"],
        "parallel_observed": seen,
    }


def observe_server_packages(cfg: StageConfig, side: Side, command: list[str]) -> dict[str, Any]:
    """The package versions of the environment the server ran in, asked of that environment:
    on the local runtime the interpreter that starts the server (its command's first word:
    the workflow's own Python for transformers serve, serve.vllm_python for vLLM). A docker
    server's image is not asked here (``read_from`` null): its ``server.version`` is vLLM's
    own GET /version answer. A bring-your-own command is not asked either."""
    from cellbench.runtime import pins

    if cfg.runtime != "local" or side.server_command is not None or not command:
        return {"read_from": None}
    env = pins.local_environment(command[0])
    return {"read_from": f"{command[0]} (importlib.metadata)", **env}


def _prepare(cfg: StageConfig, sides: list[Side]) -> None:
    """Clear what an interrupted run of this job left half-made. An arm's previous results
    (bench.json, its per-request file, lm_eval/, each with its checksum) stay whole and
    readable until this run's are: ``_publish`` replaces them at the end, and a failure before
    that leaves them as they were (the rules mark them update(), so Snakemake keeps them too)."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.arm == IMAGES:
        (cfg.out_dir / "bench.json").unlink(missing_ok=True)
    for side in sides:
        out = side.log_path.parent
        out.mkdir(parents=True, exist_ok=True)
        if cfg.arm != IMAGES:
            shutil.rmtree(out / "lm_eval.partial", ignore_errors=True)
            _drop_orphan_sidecars(out)
        side.log_path.write_bytes(b"")
        side.cache_dir.mkdir(parents=True, exist_ok=True)


def _drop_orphan_sidecars(out: Path) -> None:
    """A checksum whose file is gone describes nothing (an earlier version of this stage, or
    a hand, removed the file): it must not be mistaken for part of a result."""
    for name in ("bench.json", request_detail.file_name()):
        if not (out / name).exists():
            atomicio.checksum_path(out / name).unlink(missing_ok=True)
    if not (out / "lm_eval").exists():
        atomicio.tree_checksum_path(out / "lm_eval").unlink(missing_ok=True)


def _withdraw(out: Path) -> None:
    """Take an arm's previous results out of use before its new ones are moved in: without
    its checksums a mix of old and new (a kill half-way through ``_publish``) is refused by
    every reader and rebuilt, never read as one result."""
    for name in ("bench.json", request_detail.file_name()):
        atomicio.checksum_path(out / name).unlink(missing_ok=True)
    atomicio.tree_checksum_path(out / "lm_eval").unlink(missing_ok=True)


def _publish(cfg: StageConfig, m: Any, benches: dict[str, dict[str, Any]]) -> None:
    """Move each arm's new results over its previous ones, bench.json last: its presence with
    its checksum means the whole job succeeded."""
    for arm in cfg.arms:
        out = cfg.arm_dir(arm)
        _withdraw(out)
        if cfg.gsm8k:
            atomicio.replace_dir(out / "lm_eval.partial", out / "lm_eval")
        else:
            shutil.rmtree(out / "lm_eval", ignore_errors=True)
            (out / "lm_eval").mkdir()  # declared by the rule; empty: GSM8K switched off
        atomicio.write_tree_checksum(out / "lm_eval")
    for arm in cfg.arms:
        request_detail.write(cfg.arm_dir(arm) / request_detail.file_name(), m.runs[arm].requests)
    for arm in cfg.arms:
        path = cfg.arm_dir(arm) / "bench.json"
        try:
            write_json(path, benches[arm], checksum=True)
        except OSError as e:  # e.g. a full disk: say which file could not be written
            raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e


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
            **observed_parallelism(
                m.server_info[arm]["command"],
                run.side.log_path,
                one_process=cfg.runtime == "local" and run.side.server_command is None,
            ),
            "tp_requested": cfg.tp,
            "ep_requested": cfg.ep,
            "gpu_vendor": cfg.gpu_vendor,
            "gpu_indices": list(run.gpu_indices),
            "gpu_source": m.gpu_source,
            # Planned, not observed: the job gave another of its servers some of these GPUs.
            "planned_gpu_overlap": _shared_gpus(m.runs, arm),
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
            "server_packages": observe_server_packages(
                cfg, run.side, m.server_info[arm]["command"]
            ),
            # Read from the model folder (the assets stage's recipe file), not from the config.
            "model_origin": observe_model_origin(cfg.model),
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
        if run.capacity is not None:
            bench["capacity"] = run.capacity
        result_file.check_bench(bench, cfg.arm_dir(arm) / "bench.json")
        benches[arm] = bench
    try:
        _publish(cfg, m, benches)
    except BaseException:
        # A full disk or an interrupt here must not leave one arm looking complete.
        for arm in cfg.arms:
            for name in ("bench.json", "bench.json.sha256", *_request_files()):
                (cfg.arm_dir(arm) / name).unlink(missing_ok=True)
            shutil.rmtree(cfg.arm_dir(arm) / "lm_eval", ignore_errors=True)
            atomicio.tree_checksum_path(cfg.arm_dir(arm) / "lm_eval").unlink(missing_ok=True)
        raise
    return benches


def run_images(cfg: StageConfig) -> dict[str, Any]:
    """Serve the tuned arm of two images' cells side by side and interleave them per repeat;
    write ``OUT/bench.json`` (both sides, each point tagged with its image) and return it."""
    cfg.validate()
    sides = cfg.sides()
    _prepare(cfg, sides)
    m = _measure(cfg, sides, point_tag="image")
    points = sorted((p for run in m.runs.values() for p in run.points), key=lambda p: p["seq"])
    # Compared from what each side ran (its digest; on the local runtime the hash of its
    # server interpreter's package versions), not assumed from the runtime.
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
                **observed_parallelism(
                    m.server_info[name]["command"],
                    run.side.log_path,
                    one_process=cfg.runtime == "local" and run.side.server_command is None,
                ),
                "ignore_eos": run.ignore_eos,
                "gpu_indices": list(run.gpu_indices),
                "gpu_source": m.gpu_source,
                "planned_gpu_overlap": _shared_gpus(m.runs, name),
                "server": m.server_info[name],
                "server_log": run.side.log_path.name,
            }
            for name, run in m.runs.items()
        },
        "points": points,
    }
    result_file.check_comparison(data, cfg.out_dir / "bench.json")
    for name, run in m.runs.items():
        request_detail.write(cfg.out_dir / request_detail.file_name(name), run.requests)
    # Last: the file's presence means the whole job succeeded.
    write_json(cfg.out_dir / "bench.json", data, checksum=True)
    return data


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
