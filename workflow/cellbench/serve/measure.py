"""The serve stage's measurement: the load grid run against one or two live servers (an arm, a
pair of arms or two images) in rounds of server starts (a fresh server per side each round,
the sides' repeats interleaved within it), each point checked as it is taken, and GSM8K on
the last round's servers.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common.secrets import SECRET_ENV
from cellbench.contracts import load_shapes, request_detail, validity
from cellbench.contracts.point import PointKey, point_key
from cellbench.gsm8k.evaluate import (
    INSTANCE_PREFIX,
    choose_api,
    run_lm_eval,
)
from cellbench.serve import (
    capacity,
    loadgen,
    moe_evidence,
    observed_point,
    random_prompts,
    repeat_stop,
)
from cellbench.serve.job import IMAGES, WARM_MARKER, Side, StageConfig
from cellbench.serve.server import (
    CONTAINER_TUNED_DIR,
    RunningServer,
    ServerSpec,
    observe_version,
    serve,
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _now_ms() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


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
    """The order the sides (arms or images) run in, per repeat of a round: A B, then B A, ...
    (ABBA), so that neither always runs first after the other and slow drift weighs on both
    alike."""
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
    start_ready_s: list[float] = field(default_factory=list)  # the later rounds' starts
    requests: list[dict[str, Any]] = field(default_factory=list)  # request_detail records
    capacity: dict[str, Any] | None = None  # serve.sla's search (cellbench.serve.capacity)


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


def _spec(cfg: StageConfig, side: Side, port: int, gpus: tuple[int, ...]) -> ServerSpec:
    docker = cfg.runtime == "docker"
    return ServerSpec(
        runtime=cfg.runtime,
        model=cfg.model,
        port=port,
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


def _first_start(
    cfg: StageConfig, side: Side, spec: ServerSpec, side_stack: ExitStack, gpus: tuple[int, ...]
) -> _SideRun:
    """Start one side's first server and learn what every later start of it reuses: its
    version, whether it takes ignore_eos, the MoE config it loaded, its tokenizer."""
    docker = cfg.runtime == "docker"
    # Observed right before this server starts (the other side's start may have filled a
    # shared cache already: then this one is not cold, and says so).
    cache_at_start = cache_contents(side.cache_dir) if docker else None
    t0 = time.monotonic()
    _log(f"starting {cfg.runtime} server for {side.cell_id} {side.arm} on port {spec.port}")
    server = side_stack.enter_context(serve(spec))
    ready_s = time.monotonic() - t0
    _log(f"{side.name} server ready in {ready_s:.1f} s as model id {server.model_id!r}")
    server.describe["version"] = observe_version(server.base_url)
    if server.describe["version"]["version"]:
        _log(f"{side.name} server says it is vLLM {server.describe['version']['version']}")
    ignore_eos = cfg.ignore_eos and loadgen.probe_ignore_eos(server.base_url, server.model_id)
    if cfg.ignore_eos and not ignore_eos:
        _log(f"{side.name} server refuses ignore_eos: real output lengths are recorded")
    # Before any number is taken: did this server load the config its arm needs?
    moe_config = check_moe_config(cfg, side, server)
    tok = random_prompts.load_tokenizer(cfg.model, server.base_url, server.model_id)
    return _SideRun(side, server, ready_s, ignore_eos, tok, gpus, cache_at_start, moe_config)


def _new_round(
    runs: dict[str, _SideRun],
    specs: dict[str, ServerSpec],
    job_stack: ExitStack,
    side_stacks: dict[str, ExitStack],
    order: list[str],
    round_: int,
) -> None:
    """Stop every side's server, then start each afresh in ``order``: a new round of
    server starts (same spec, port and log, appended to; the job's last MoE-config check
    reads the whole log, so what every start loaded is checked)."""
    for name in order:
        side_stacks[name].close()
    for name in order:
        # Entered into the job's stack, so a later failure stops the new server too.
        side_stacks[name] = job_stack.enter_context(ExitStack())
        t0 = time.monotonic()
        runs[name].server = side_stacks[name].enter_context(serve(specs[name]))
        runs[name].server.describe["version"] = observe_version(runs[name].server.base_url)
        ready = time.monotonic() - t0
        runs[name].start_ready_s.append(ready)
        _log(f"{name} server started for round {round_} in {ready:.1f} s")
    _check_alive(runs, f"after the starts of round {round_}")


def _measure(cfg: StageConfig, sides: list[Side], point_tag: str | None = None) -> _Measured:
    """Run the grid in rounds: each round starts a fresh server per side (A B, then B A, ...
    by round), measures the points still open ``cfg.repeats`` times interleaved side by side,
    and is over; GSM8K runs on the last round's servers, which are then stopped. Two-sided
    jobs with ``cfg.starts_cap`` above ``cfg.starts_min`` stop points whose answer is known
    (``repeat_stop``). ``point_tag`` names a key that each point gets, holding its side's
    name. The same path serves both arms of a cell and two images of a cell."""
    from cellbench.runtime.leases import gpu_lease

    names = [side.name for side in sides]
    started = _now()
    docker = cfg.runtime == "docker"
    # A container per side holds GPUs of its own. The local runtime's servers are host
    # processes on the job's GPUs, all sides on the same ones (one host, one side measured at
    # a time): its telemetry then includes the idle other side, and bench.json says so.
    per_side = cfg.gpus
    n_gpus = per_side * len(sides) if docker else cfg.gpus
    stopping = len(sides) == 2 and cfg.starts_cap > cfg.starts_min
    rounds = cfg.starts_cap if stopping else cfg.starts_min
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
        # One stack per side inside the job's: a new round (or GSM8K's further instances)
        # stops and restarts one side's server alone.
        side_stacks: dict[str, ExitStack] = {}
        # Started one after the other, not at once: two first starts of one image would
        # otherwise fill the shared compile cache concurrently.
        for i, side in enumerate(sides):
            gpus = (
                lease.gpu_indices[i * per_side : (i + 1) * per_side]
                if docker
                else lease.gpu_indices
            )
            specs[side.name] = _spec(cfg, side, ports[i], tuple(gpus))
            side_stacks[side.name] = stack.enter_context(ExitStack())
            runs[side.name] = _first_start(
                cfg, side, specs[side.name], side_stacks[side.name], tuple(gpus)
            )
        _check_alive(runs, "before the grid started")
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
            goodput_ms=cfg.goodput,  # parsed once, by StageConfig.from_job
        )
        stop = _repeat_stop(cfg, load_points) if stopping else None
        order: list[list[str]] = []
        for round_ in range(rounds):
            wanted = stop.wanted(round_) if stop is not None else None
            if wanted is not None and not wanted:
                break
            starts_order = names if round_ % 2 == 0 else list(reversed(names))
            if round_:
                _new_round(runs, specs, stack, side_stacks, starts_order, round_)
            if len(sides) > 1:
                _log(f"round {round_}: servers started {' '.join(starts_order)}")
            for rep in range(cfg.repeats):
                global_rep = round_ * cfg.repeats + rep
                # ABBA over the job's repeats, across rounds too: with one repeat a start,
                # round 0 measures A then B, round 1 B then A
                rep_order = arm_order(names, global_rep + 1)[global_rep]
                order.append(rep_order)
                for name in rep_order:
                    for gp in cfg.grid:
                        for lp in load_points:
                            if wanted is not None and _key(gp, lp) not in wanted:
                                continue  # this point's answer is known: no more starts for it
                            # seq: job-wide order of every side's points, the interleaving audit
                            extra = {"start": round_, "seq": seq}
                            if point_tag is not None:
                                extra[point_tag] = name
                            _measure_point(cfg, runs, name, gp, lp, global_rep, observe, extra)
                            seq += 1
            if stop is not None:
                _decide_round(stop, runs, names, round_)
        # Invalid repeats are kept and counted; a point left without enough valid ones to
        # answer ends the job here, before anything is written.
        validity.check_enough({n: r.points for n, r in runs.items()}, point_key)
        if stop is not None:
            stop.annotate(run.points for run in runs.values())
            _log(stop.summary())
        if cfg.sla:  # on the last round's servers, before GSM8K (a comparison has none)
            for name, found in capacity.on_servers(cfg, runs, _check_alive, _log).items():
                runs[name].capacity = found
        if cfg.gsm8k:
            for k in range(1, cfg.gsm8k_instances + 1):
                if k > 1:
                    for name, run in runs.items():
                        run.server = _restart(run, specs[name], stack, side_stacks, k)
                _gsm8k_sides(cfg, runs, k)
        for run in runs.values():
            # Again over the whole log: a process that started later (a TP rank, a restarted
            # engine, a later round) may have loaded another file.
            run.moe_config = check_moe_config(cfg, run.side, run.server, wait_s=0.0)
        server_info = {
            name: {
                "launcher": cfg.runtime,
                "model": cfg.model,
                "model_id": run.server.model_id,
                "ready_s": run.ready_s,
                "starts_ready_s": [run.ready_s, *run.start_ready_s],
                "command": [str(a) for a in run.server.describe["command"]],
                "env": server_env(cfg, run),
                # Asked of the running server (GET /version), not read from any other process.
                "version": run.server.describe.get("version"),
            }
            for name, run in runs.items()
        }
    return _Measured(runs, order, server_info, started, _now(), lease.gpu_source)


def _mark_validity(
    cfg: StageConfig, pt: dict[str, Any], detail: dict[str, list], side: str
) -> None:
    """Record why a repeat cannot count (``validity``) in its ``invalid`` field, and say so
    on the terminal after its progress line."""
    reason = validity.invalid_reason(
        pt,
        detail,
        max_failed_share=cfg.max_failed_share,
        min_tpot_ms=cfg.min_plausible_tpot_ms,
        min_itl_ms=cfg.min_plausible_itl_ms,
    )
    _log(progress_line(pt, side))
    if reason is not None:
        pt["invalid"] = reason
        _log(f"invalid repeat: #{pt['seq']} {side} isl={pt['isl']} osl={pt['osl']} "
             f"{load_shapes.point_label(pt)} repeat {pt['repeat']}: {reason}")  # fmt: skip


def _measure_point(
    cfg: StageConfig,
    runs: dict[str, _SideRun],
    name: str,
    gp: dict[str, int],
    lp: dict[str, Any],
    rep: int,
    observe: observed_point.Observation,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One grid point of one side's repeat ``rep`` (job-wide), checked and recorded with the
    fields of ``extra`` (its start, its place in the job's order)."""
    run = runs[name]
    ps = loadgen.PointSpec(
        isl=gp["isl"],
        osl=gp["osl"],
        max_concurrency=lp["max_concurrency"],
        num_prompts=lp["num_prompts"],
        num_warmups=lp["num_warmups"],
        request_rate=lp["request_rate"],
        burstiness=lp["burstiness"],
        # Fresh prompts per repeat (a prefix cache must not serve repeat 2), the same ones
        # for both sides (paired comparison).
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
    pt.update(extra)
    pt["repeat"] = rep
    pt["started_at"] = point_started
    _check_alive(
        runs,
        f"mid-run at {name} isl={ps.isl} osl={ps.osl}",
        suspect=name if pt["failed"] else None,
    )
    _mark_validity(cfg, pt, detail, name)
    run.points.append(pt)
    run.requests.append(request_detail.record(pt, detail))
    return pt


def _key(gp: dict[str, int], lp: dict[str, Any]) -> PointKey:
    """A grid point's key (point_key) before it is measured."""
    return point_key({**gp, **lp})


def _repeat_stop(cfg: StageConfig, load_points: list[dict[str, Any]]) -> repeat_stop.RepeatStop:
    keys = [_key(gp, lp) for gp in cfg.grid for lp in load_points]
    return repeat_stop.RepeatStop(
        points=keys,
        minimum=cfg.starts_min,
        cap=cfg.starts_cap,
        margin_pct=cfg.min_change_pct,
        max_failed_share=cfg.max_failed_share,
    )


def _decide_round(
    stop: repeat_stop.RepeatStop, runs: dict[str, _SideRun], names: list[str], round_: int
) -> None:
    """After round ``round_``: ask the stopping rule about each point measured in it."""
    a, b = (runs[n].points for n in names)
    measured = {point_key(p) for p in a if p["start"] == round_}
    for key in sorted(measured):
        step = stop.record(
            key,
            [p for p in a if point_key(p) == key],
            [p for p in b if point_key(p) == key],
        )
        if step["action"] == "stop" and round_ + 1 >= stop.minimum:
            isl, osl, label = key
            # The reason the point's records will carry, so log and files agree.
            reason = stop.outcome(key)["stop_reason"]
            _log(f"{isl}-{osl} {label}: {reason} after {step['starts']} starts")


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


def _gsm8k_sides(cfg: StageConfig, runs: dict[str, _SideRun], instance: int) -> None:
    """GSM8K instance ``instance`` on every side's server at once: the load grid is over, so
    nothing timed runs beside it, and each side's lm-eval writes its own folder. Every side
    is waited for; then a dead server is reported first, else the first lm-eval failure."""
    folders = {run.side.log_path.parent for run in runs.values()}
    if len(folders) < len(runs):  # sides that share a folder (an images job) take turns
        for name, run in runs.items():
            _gsm8k_instance(cfg, run, instance)
            _check_alive(runs, f"during lm-eval instance {instance} on the {name} server")
        return
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = [pool.submit(_gsm8k_instance, cfg, run, instance) for run in runs.values()]
        errors = [f.exception() for f in futures]
    _check_alive(runs, f"during lm-eval instance {instance} (all sides at once)")
    for error in errors:
        if error is not None:
            raise error


def _gsm8k_instance(cfg: StageConfig, run: _SideRun, instance: int) -> None:
    """lm-eval GSM8K on one side's current server into ``lm_eval.partial/instance-K``."""
    out = run.side.log_path.parent
    api, template_source = choose_api(cfg.gsm8k_api, cfg.model, cfg.hf_cache)
    _log(
        f"running lm-eval GSM8K instance {instance} on the {run.side.name} server "
        f"({api}: {template_source})"
    )
    started = time.monotonic()
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
    _log(
        f"lm-eval GSM8K instance {instance} on the {run.side.name} server finished in "
        f"{time.monotonic() - started:.1f} s"
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
