# Serve the cell's model once per arm (untuned, tuned): the ISL-OSL grid with the load
# generator, then lm-eval's GSM8K run against the same server.


def serve_inputs(wildcards):
    inputs = model_inputs(wildcards)
    if wildcards.arm == "tuned":
        inputs["tuned"] = CELL_DIR.format(**wildcards) + "/tune/configs"
    if config["gsm8k"]["local_questions"]:
        inputs["gsm8k"] = "results/assets/gsm8k"
    return inputs


def serve_args(wildcards, input):
    """serve_stage's command line: the server, the grid and the GSM8K run of one arm."""
    model = model_entry(wildcards)
    serve, gsm8k = config["serve"], config["gsm8k"]
    args = [
        "--runtime",
        RUNTIME,
        "--cell-id",
        f"{wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
        "--arm",
        wildcards.arm,
        "--model",
        model_source(wildcards),
        "--served-model-name",
        wildcards.model,
        "--tp",
        wildcards.tp,
        "--ep",
        wildcards.ep,
        "--serve-args-json",
        json.dumps(model["serve_args"]),
        "--grid-json",
        json.dumps(serve["grid"]),
        "--concurrency",
        ",".join(map(str, serve["concurrency"])),
        "--prompts-per-concurrency",
        str(serve["prompts_per_concurrency"]),
        "--warmups-per-concurrency",
        str(serve["warmups_per_concurrency"]),
        "--repeats",
        str(serve["repeats"]),
        "--ignore-eos" if serve["ignore_eos"] else "--no-ignore-eos",
        "--ready-timeout",
        str(serve["ready_timeout_s"]),
        "--max-failed-share",
        str(serve["max_failed_share"]),
        "--gsm8k-fewshot",
        str(gsm8k["num_fewshot"]),
        "--lease-dir",
        "results/.leases",
    ]
    if gsm8k["limit"]:
        args += ["--gsm8k-limit", str(gsm8k["limit"])]
    if "gsm8k" in input.keys():
        args += ["--gsm8k-task-dir", input.gsm8k]
    if wildcards.arm == "tuned":
        args += ["--tuned-config-dir", input.tuned]
    if RUNTIME == "docker":
        args += [
            "--image-ref",
            PINS.ref(wildcards.image),
            "--image-digest",
            PINS.digest(wildcards.image),
            "--gpu-vendor",
            config["gpu_vendor"],
            "--gpus",
            wildcards.tp,
            "--total-gpus",
            str(config["gpus"]),
            "--hf-cache",
            str(Path(config["hf_cache"]).expanduser()),
        ]
    else:
        args += ["--image-digest", PINS.digest(wildcards.image)]
    return shlex.join(args)


rule serve:
    input:
        unpack(serve_inputs),
    output:
        bench=f"{CELL_DIR}/serve/{{arm}}/bench.json",
        lm_eval=directory(f"{CELL_DIR}/serve/{{arm}}/lm_eval"),
    log:
        f"{LOG_DIR}/serve-{{arm}}.log",
    benchmark:
        f"{BENCH_DIR}/serve-{{arm}}.tsv"
    threads: MEASURING_THREADS
    resources:
        gpu=gpus_for,
    params:
        digest=lambda wildcards: PINS.digest(wildcards.image),
        args=serve_args,
        out=lambda wildcards, output: str(Path(output.bench).parent),
    shell:
        "{PYTHON_HOST} -m cellbench.serve_stage {params.args} --out-dir {params.out} > {log} 2>&1"
