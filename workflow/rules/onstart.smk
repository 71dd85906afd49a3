# The workflow's only `onstart` hook: Snakemake keeps the last one defined, so a second hook
# anywhere would silently replace this one (tests/workflow/test_faults.py checks there is one).


onstart:
    # Before any job: every pinned image must be on this host or in its registry.
    problems = PINS.missing()
    if problems:
        raise WorkflowError("cannot start: " + "; ".join(problems))
    # serve_args through the vLLM inside each pinned image (docker run pulls a digest that
    # only its registry holds, as the first job would).
    if RUNTIME == "docker":
        from cellbench.config import serve_args

        refused, unchecked = serve_args.check_images(
            config, {name: PINS.ref(name) for name in config["images"]}
        )
        for line in unchecked:
            print(f"cellbench: warning: {line}", file=sys.stderr)
        if refused:
            raise WorkflowError("cannot start: " + "; ".join(refused))
    # A SIGINT or SIGTERM sent to the Snakemake process alone stops the running jobs within
    # seconds (cellbench/runtime/interrupts.py): Snakemake by itself would let them run to the end.
    from cellbench.runtime import interrupts

    interrupts.install()
    # The cost of what is about to run, on the terminal and in results/plan/RUN_LABEL/estimate.json for
    # the report's estimate-against-actual table. An estimate that fails stops nothing.
    from cellbench.config import ceiling, cost

    try:
        estimate = cost.estimate(config, "results")
        cost.write(estimate, "results")
        print(
            "cellbench plan (estimate; `cellbench plan` prints it without running):"
        )
        print(cost.render(estimate))
    except Exception as exc:  # noqa: BLE001
        estimate = None
        print(f"cellbench plan: no estimate ({type(exc).__name__}: {exc})")
    # The config check priced the run by the plan's assumptions; the history may say more.
    try:
        if estimate is not None:
            ceiling.check(config, estimate)
    except cbconfig.ConfigError as exc:
        raise WorkflowError(f"cannot start: {exc}") from None
