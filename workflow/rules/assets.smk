# Inputs the embedded default makes itself: a tiny MoE model and a GSM8K-format question set.


rule tiny_model:
    output:
        directory("results/assets/models/{model}"),
    log:
        "results/logs/assets/model-{model}.log",
    benchmark:
        "results/benchmarks/assets/model-{model}.tsv"
    conda:
        HOST_ENV
    params:
        kind=lambda wildcards: config["models"][wildcards.model]["build"],
    shell:
        logged("python -m cellbench.assets model --kind {params.kind} --out {output}")


# One folder per question count (results/assets/gsm8k/nN): configs asking for the same count
# share it, and a config asking for another never rewrites the set a third one reads.
rule gsm8k_set:
    output:
        directory(GSM8K_SET),
    log:
        f"results/logs/assets/gsm8k-n{config['gsm8k']['local_questions']}.log",
    benchmark:
        f"results/benchmarks/assets/gsm8k-n{config['gsm8k']['local_questions']}.tsv"
    conda:
        HOST_ENV
    params:
        n=config["gsm8k"]["local_questions"],
    shell:
        logged("python -m cellbench.assets gsm8k --n {params.n} --out {output}")
