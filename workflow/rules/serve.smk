# Serve the cell's model in both arms (untuned, tuned): the ISL-OSL grid with the load
# generator, then lm-eval's GSM8K run against each arm's own server.
# serve.interleave_arms (default): one `serve_pair` job per cell runs both servers at once and
# alternates the arms repeat by repeat. Otherwise one `serve` job per arm. Both write the same
# per-arm files, so the gsm8k, report and archive rules read either.
# Their outputs are update(): Snakemake neither deletes a cell's previous results before the
# job runs nor leaves them deleted when it fails (it restores them); the job itself swaps the
# new ones in only once they are whole (cellbench.serve.stage), so a failed or interrupted
# rerun never costs the last good results.


# The stage's job (cellbench.config.jobargs.serve_job) as canonical JSON: params.settings is
# tracked (every value that shapes a number), params.host is not.
SERVE_SHELL = logged(
    "python -m cellbench.serve --job {params.settings:q} --host {params.host:q}"
    " --out-dir {params.out}"
)


if config["serve"]["interleave_arms"]:

    rule serve_pair:
        input:
            unpack(lambda wildcards: serve_inputs(wildcards, ARMS)),
            refused=refused_results,
        output:
            untuned_bench=update(f"{CELL_DIR}/serve/untuned/bench.json"),
            untuned_lm_eval=update(directory(f"{CELL_DIR}/serve/untuned/lm_eval")),
            tuned_bench=update(f"{CELL_DIR}/serve/tuned/bench.json"),
            tuned_lm_eval=update(directory(f"{CELL_DIR}/serve/tuned/lm_eval")),
        log:
            f"{LOG_DIR}/serve-pair.log",
        benchmark:
            f"{BENCH_DIR}/serve-pair.tsv"
        conda:
            HOST_ENV
        threads: MEASURING_THREADS
        resources:
            # Two servers of TP GPUs each, alive together.
            gpu=lambda wildcards: 2 * gpus_for(wildcards),
        params:
            settings=lambda wildcards: serve_settings(wildcards, "pair"),
            host=serve_host_args,
            out=lambda wildcards: os.path.join(CELL_DIR.format(**wildcards), "serve"),
        shell:
            SERVE_SHELL

else:

    rule serve:
        input:
            unpack(lambda wildcards: serve_inputs(wildcards, [wildcards.arm])),
            refused=refused_results,
        output:
            bench=update(f"{CELL_DIR}/serve/{{arm}}/bench.json"),
            lm_eval=update(directory(f"{CELL_DIR}/serve/{{arm}}/lm_eval")),
        log:
            f"{LOG_DIR}/serve-{{arm}}.log",
        benchmark:
            f"{BENCH_DIR}/serve-{{arm}}.tsv"
        conda:
            HOST_ENV
        threads: MEASURING_THREADS
        resources:
            gpu=gpus_for,
        params:
            settings=lambda wildcards: serve_settings(wildcards, wildcards.arm),
            host=serve_host_args,
            out=lambda wildcards, output: str(Path(output.bench).parent),
        shell:
            SERVE_SHELL
