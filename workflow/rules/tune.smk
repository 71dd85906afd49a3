# Tune the fused-MoE Triton kernel for the cell's shapes; write vLLM's JSON, an AITER CSV, a log.


rule tune:
    input:
        unpack(model_inputs),
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
        digest=lambda wildcards: PINS.digest(wildcards.image),
        code_version=config["tune"]["code_version"],
        python=in_cell_python,
        steps=step_args,
        args=tune_args,
        out=lambda wildcards, output: str(Path(output.summary).parent),
    shell:
        "python -m cellbench.steps {params.steps} --log {log} -- "
        "{params.python} -m cellbench.tuner {params.args} --out {params.out}"
