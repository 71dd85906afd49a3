# The workflow's only `onstart` hook: Snakemake keeps the last one defined, so a second hook
# anywhere would silently replace this one (tests/workflow/test_faults.py checks there is one).


onstart:
    # Before any job: every pinned image must be on this host or in its registry.
    problems = PINS.missing()
    if problems:
        raise WorkflowError("cannot start: " + "; ".join(problems))
    # A SIGINT or SIGTERM sent to the Snakemake process alone stops the running jobs within
    # seconds (cellbench/runtime/interrupts.py): Snakemake by itself would let them run to the end.
    from cellbench.runtime import interrupts

    interrupts.install()
    # The cost of what is about to run, on the terminal and in results/plan/RUN_LABEL/estimate.json for
    # the report's estimate-against-actual table. An estimate that fails stops nothing.
    from cellbench.config import cost

    try:
        estimate = cost.estimate(config, "results")
        cost.write(estimate, "results")
        print(
            "cellbench plan (estimate; `cellbench plan` prints it without running):"
        )
        print(cost.render(estimate))
    except Exception as exc:  # noqa: BLE001
        print(f"cellbench plan: no estimate ({type(exc).__name__}: {exc})")
