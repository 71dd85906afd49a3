# Serve the cell's model in both arms (untuned, tuned): the ISL-OSL grid with the load
# generator, then lm-eval's GSM8K run against each arm's own server.
# serve.interleave_arms (default): one `serve_pair` job per cell runs both servers at once and
# alternates the arms repeat by repeat. Otherwise one `serve` job per arm. Both write the same
# per-arm files, so the gsm8k, report and archive rules read either.


def serve_inputs(wildcards, arms):
    inputs = model_inputs(wildcards)
    if "tuned" in arms:
        inputs["tuned"] = CELL_DIR.format(**wildcards) + "/tune/configs"
    if config["gsm8k"]["local_questions"]:
        inputs["gsm8k"] = "results/assets/gsm8k"
    return inputs


def serve_args(wildcards, input, arm):
    """serve_stage's command line for one arm, or for both (arm="pair")."""
    model = model_entry(wildcards)
    serve, gsm8k = config["serve"], config["gsm8k"]
    args = [
        "--runtime",
        RUNTIME,
        "--cell-id",
        f"{wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
        "--arm",
        arm,
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
    if "tuned" in input.keys():
        args += ["--tuned-config-dir", input.tuned]
    if RUNTIME == "docker":
        args += [
            "--image-ref",
            PINS.ref(wildcards.image),
            "--image-digest",
            PINS.digest(wildcards.image),
            "--gpu-vendor",
            config["gpu_vendor"],
            "--gpus",  # per server
            wildcards.tp,
            "--total-gpus",
            str(config["gpus"]),
            "--hf-cache",
            str(Path(config["hf_cache"]).expanduser()),
        ]
    else:
        args += ["--image-digest", PINS.digest(wildcards.image)]
    return shlex.join(args)


SERVE_SHELL = "{PYTHON_HOST} -m cellbench.serve_stage {params.args} --out-dir {params.out} > {log} 2>&1"


if config["serve"]["interleave_arms"]:

    rule serve_pair:
        input:
            unpack(lambda wildcards: serve_inputs(wildcards, ARMS)),
        output:
            untuned_bench=f"{CELL_DIR}/serve/untuned/bench.json",
            untuned_lm_eval=directory(f"{CELL_DIR}/serve/untuned/lm_eval"),
            tuned_bench=f"{CELL_DIR}/serve/tuned/bench.json",
            tuned_lm_eval=directory(f"{CELL_DIR}/serve/tuned/lm_eval"),
        log:
            f"{LOG_DIR}/serve-pair.log",
        benchmark:
            f"{BENCH_DIR}/serve-pair.tsv"
        threads: MEASURING_THREADS
        resources:
            # Two servers of TP GPUs each, alive together.
            gpu=lambda wildcards: 2 * gpus_for(wildcards),
        params:
            digest=lambda wildcards: PINS.digest(wildcards.image),
            args=lambda wildcards, input: serve_args(wildcards, input, "pair"),
            out=lambda wildcards: CELL_DIR.format(**wildcards) + "/serve",
        shell:
            SERVE_SHELL

else:

    rule serve:
        input:
            unpack(lambda wildcards: serve_inputs(wildcards, [wildcards.arm])),
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
            args=lambda wildcards, input: serve_args(wildcards, input, wildcards.arm),
            out=lambda wildcards, output: str(Path(output.bench).parent),
        shell:
            SERVE_SHELL
