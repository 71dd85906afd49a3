# Tune the fused-MoE Triton kernel for the cell's shapes; write vLLM's JSON, an AITER CSV, a log.


rule tune:
    input:
        unpack(model_inputs),
        refused=refused_results,
    output:
        summary=f"{CELL_DIR}/tune/summary.json",
        configs=directory(f"{CELL_DIR}/tune/configs"),
    log:
        f"{LOG_DIR}/tune.log",
    benchmark:
        f"{BENCH_DIR}/tune.tsv"
    conda:
        HOST_ENV
    threads: MEASURING_THREADS
    resources:
        gpu=gpus_for,
    params:
        # Tracked (a rerun trigger): the stage's job (cellbench.config.jobargs.tune_job) as
        # canonical JSON: the model's shape, the tune settings, pinned digest, GPUs, variables.
        settings=tune_settings,
        # Untracked host details: interpreter, leases, mounts, the host's GPU count.
        python=lambda wildcards, input: in_cell_python(wildcards),
        steps=step_host_args,
        out=lambda wildcards, output: str(Path(output.summary).parent),
    shell:
        # cellbench.runtime.steps writes the log itself; on failure print its reason here too.
        "python -m cellbench.runtime.steps {params.steps} --log {log} -- "
        "{params.python} -m cellbench.tune --job {params.settings:q} --out {params.out} "
        "|| {{ rc=$?; python -m cellbench.joblog {log:q} >&2; exit $rc; }}"
