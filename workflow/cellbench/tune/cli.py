"""`python -m cellbench.tune` / `cellbench tune`: tune the fused-MoE kernel for one shape.

In-container module: stdlib + torch + triton (+ vllm for --backend vllm).

Outputs in --out DIR: configs/<vLLM file name>.json, tuned_fmoe.csv, tuning_log.jsonl and, last
(it marks the step complete), summary.json. Bad input exits 2 before any GPU work. A log left by
a killed run is resumed only when it was written for the same image and problem (resume.py).

Each summary entry also records its baseline, the config vLLM would use at that batch size
without the tuned file, timed side by side with the pick, and the pick's improvement_pct over
it (see baseline.py).

The job: ``--job JSON`` (a ``TuneJob``, tune/job.py; what the workflow passes) and/or one
flag per field (by hand). The parts: plan.py reads and checks the job, device_run.py tunes on
each device, outputs.py holds the keep rule and what is printed; this module runs them and
writes the files.
"""

from __future__ import annotations

import platform
import sys
import time
from typing import Any

from cellbench.tune.device_run import run_all
from cellbench.tune.outputs import (
    CSV_NAME,
    LOG_NAME,
    SUMMARY_NAME,
    apply_keep,
    csv_rows,
    human_summary,
)
from cellbench.tune.plan import Plan, UsageError, job_from_argv, make_plan

__all__ = ["main", "run", "OutputError"]


class OutputError(OSError):
    """The output folder could not be written (exit status 2, one line)."""


def _tuner_version() -> str:
    """The cellbench package version of the tuner that ran (it is mounted into the image)."""
    from cellbench import __version__

    return __version__


def _installed_version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run(plan: Plan) -> dict[str, Any]:
    """Tune per the plan and write all artifacts (summary.json last); returns the summary."""
    import torch
    import triton

    from cellbench.tune.artifacts import atomic_write_json, write_tuned_csv
    from cellbench.tune.resume import claim_log, log_identity

    t0 = time.perf_counter()
    _clear_out(plan)
    versions = {"tuner": _tuner_version(), "triton": triton.__version__,
                "torch": torch.__version__, "vllm": _installed_version("vllm")}  # fmt: skip
    log_state = claim_log(plan.out / LOG_NAME, log_identity(plan, versions))
    res = run_all(plan)
    entries = res["entries"]
    kept_baseline = apply_keep(entries, plan.keep)
    _write_configs(plan, entries, triton.__version__)
    cu = None
    if plan.on_gpu:
        cu = torch.cuda.get_device_properties(0).multi_processor_count
    write_tuned_csv(plan.out / CSV_NAME, csv_rows(plan, entries, cu))
    summary = {
        **_identity(plan, res),
        "complete": not res.get("skipped_batch_sizes"),
        "skipped_batch_sizes": res.get("skipped_batch_sizes", []),
        "entries": entries,
        # Which picks the tuned file holds: those that beat vLLM's own config (default), or all.
        "keep": plan.keep,
        "kept_baseline": kept_baseline,
        **_costs(res["stats"], time.perf_counter() - t0),
        **_run_record(plan, res, log_state),
    }
    if not plan.on_gpu:
        summary["timing"]["note"] = (
            "Triton CPU interpreter wall-clock medians: they rank configs for the interpreter "
            "only and say nothing about GPU speed"
        )
    atomic_write_json(plan.out / SUMMARY_NAME, summary, checksum=True)
    print(human_summary(summary), flush=True)
    return summary


def _clear_out(plan: Plan) -> None:
    """Create the output folder and remove a summary an earlier run left (a rerun is not
    complete until it ends)."""
    try:
        plan.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only file system, permissions: the user's path, not a bug
        raise OutputError(f"--out {plan.out}: cannot create it: {exc.strerror or exc}") from None
    (plan.out / SUMMARY_NAME).unlink(missing_ok=True)


def _write_configs(plan: Plan, entries: dict[str, Any], triton_version: str) -> None:
    """The tuned file in vLLM's format and, where the builtin kernel measured its paths, the
    path choices beside it."""
    from cellbench.common.atomicio import checksum_path
    from cellbench.tune.artifacts import (
        path_choices_file_name,
        write_path_choices,
        write_vllm_config,
    )

    config_file = plan.config_file
    write_vllm_config(
        plan.out / "configs",
        config_file,
        {int(m): e["config"] for m, e in entries.items()},
        triton_version,
        plan.platform == "rocm",
    )
    choices = {
        int(m): {**e["path_choice"], "config": e["config"]}
        for m, e in entries.items()
        if e.get("path_choice")
    }
    paths_file = plan.out / "configs" / path_choices_file_name(config_file)
    if choices:
        write_path_choices(plan.out / "configs", config_file, choices)
    else:  # a rerun that measured none must not leave an older run's choices in force
        paths_file.unlink(missing_ok=True)
        checksum_path(paths_file).unlink(missing_ok=True)


def _identity(plan: Plan, res: dict[str, Any]) -> dict[str, Any]:
    """What was tuned, where and with which versions (the summary's first keys)."""
    import torch
    import triton

    return {
        "shape": plan.shape.to_dict(),
        "device_name": plan.device_name,
        "config_file": plan.config_file,
        "backend": plan.backend,
        "mode": plan.mode,
        "dtype": plan.dtype_label,
        "compute_dtype": plan.act_dtype,
        "compute_dtype_note": plan.act_note or None,
        "interpreter": not plan.on_gpu,
        "platform": plan.platform,
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "tuner_version": _tuner_version(),
        "python_version": platform.python_version(),
        # Read where the tuner runs (inside the image on docker): what shaped the numbers.
        "vllm_version": _installed_version("vllm"),
        # --backend vllm: which parts of the timed call were vLLM's, and from where
        "vllm_kernel": res.get("vllm_kernel"),
        "batch_sizes": plan.batch_sizes,
    }


def _costs(st: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """The run's counts and seconds (cpu: each device process's own CPU time plus its
    compile workers')."""
    return {
        # timed: candidates timed by this run; reused: read back from a resumed log;
        # new_kernels: distinct kernels this run compiled
        "counts": {
            **{k: st.get(k, 0) for k in ("timed", "reused", "pruned", "failed")},
            "new_kernels": st.get("compiled", 0),
        },
        "seconds": {
            "wall": wall_s,
            "cpu": st.get("cpu_s", 0.0),
            "gpu": st.get("gpu_s", 0.0),
            "compile_cpu": st.get("compile_cpu_s", 0.0),
            "setup": st.get("setup_s", 0.0),
            "compile_wait": st.get("compile_wait_s", 0.0),
        },
    }


def _run_record(plan: Plan, res: dict[str, Any], log_state: Any) -> dict[str, Any]:
    """How the search ran: its workers, space, limits, ceilings, timing, knobs and log."""
    budget = res.get("compile_budget")
    return {
        "compile_workers": res.get("compile_workers"),
        "space": res["space"],
        "hardware_limits": res["limits"],
        "ceilings": res["ceilings"],
        "timing": res["timing"],
        "max_configs": plan.max_configs,
        "compile_budget": list(budget) if budget else None,
        "seed_configs": plan.seed_configs,
        "seed": plan.seed,
        "resumed_log_records": res["resumed_log_records"],
        # the log it resumed, or the other image's (or problem's) log it set aside and why
        "log": log_state,
        "per_device": res.get("per_device"),
        "argv": plan.argv,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 on success, 2 on bad input, 1 when tuning failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        job, out = job_from_argv(argv)
        plan = make_plan(job, out, argv)
    except SystemExit as e:  # argparse: --help, or a flag it refused (its message printed)
        return int(e.code or 0)
    except UsageError as e:
        print(f"cellbench tune: error: {e}", file=sys.stderr)
        return 2
    try:
        run(plan)
    except OutputError as e:
        print(f"cellbench tune: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report and fail the step; the log stays for resume
        print(f"cellbench tune: failed: {type(e).__name__}: {e}", file=sys.stderr)
        import traceback

        traceback.print_exc()
        return 1
    return 0
