# GSM8K per arm: lm-eval's results and per-sample log (written by the serve job, which ran
# lm-eval against its server) turned into the project's tidy schema.


rule gsm8k:
    input:
        lm_eval=f"{CELL_DIR}/serve/{{arm}}/lm_eval",
        refused=refused_results,
    output:
        # update(): a failed summary (an lm-eval folder it refuses) keeps the previous one.
        update(f"{CELL_DIR}/gsm8k/{{arm}}.json"),
    log:
        f"{LOG_DIR}/gsm8k-{{arm}}.log",
    benchmark:
        f"{BENCH_DIR}/gsm8k-{{arm}}.tsv"
    conda:
        HOST_ENV
    params:
        cell=lambda wildcards: f"{wildcards.image}/{wildcards.model}/tp{wildcards.tp}-ep{wildcards.ep}",
    shell:
        logged(
            "python -m cellbench.gsm8k summarize --lm-eval-dir {input.lm_eval} "
            "--cell-id {params.cell} --arm {wildcards.arm} --out {output}"
        )
