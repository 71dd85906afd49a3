# Tune the fused-MoE Triton kernel for the cell's shapes; write vLLM's JSON, an AITER CSV, a log.


def tune_args(wildcards):
    """The tuner's command line for a cell; everything that changes the result is in here."""
    model = model_entry(wildcards)
    tune = config["tune"]
    model_config = model.get("model_config") or model_source(wildcards)
    args = ["--model-config", model_config, "--tp", wildcards.tp]
    if int(wildcards.ep) > 1:
        args.append("--ep")
    dtype = model["dtype"]
    if dtype in ("bf16", "fp16", "fp32"):
        # Unquantised: no dtype in vLLM's file name; the activations' dtype is what differs.
        args += ["--dtype", "none", "--act-dtype", dtype]
    else:
        args += ["--dtype", dtype]
    block = model["block_shape"]
    args += [
        "--block-shape",
        f"{block[0]},{block[1]}" if isinstance(block, list) else str(block or "none"),
    ]
    args += ["--batch-sizes", ",".join(map(str, cbconfig.batch_sizes(config)))]
    args += ["--mode", tune["mode"], "--backend", tune["backend"]]
    if tune["max_configs"]:
        args += ["--max-configs", str(tune["max_configs"])]
    return shlex.join(args)


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
        "{PYTHON_HOST} -m cellbench.steps {params.steps} --log {log} -- "
        "{params.python} -m cellbench.tuner {params.args} --out {params.out}"
