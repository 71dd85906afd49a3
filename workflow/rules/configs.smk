# Tuned configs per ROCm version (archive label) and device: every cell's vLLM JSON files and
# AITER rows in results/configs/{label}/{device}/, usable as VLLM_TUNED_CONFIG_FOLDER as it is,
# with a manifest (cellbench.configs.collect). Built in a temporary folder and swapped in
# whole; the declared output is INDEX.json, written last. tune.keep and
# tune.min_improvement_pct are tracked here only, so editing them reruns this job alone.


rule configs:
    input:
        summaries=lambda wildcards: [
            f"{c.path}/tune/summary.json" for c in cells_with_label(wildcards.label)
        ],
    output:
        "results/configs/{label}/INDEX.json",
    log:
        "results/logs/configs-{label}.log",
    benchmark:
        "results/benchmarks/configs-{label}.tsv"
    conda:
        HOST_ENV
    params:
        settings=lambda wildcards: configs_settings(wildcards.label),
        cells=lambda wildcards: " ".join(
            sorted(c.cell_id for c in cells_with_label(wildcards.label))
        ),
        images=lambda wildcards: configs_images(wildcards.label),
        keep=config["tune"]["keep"],
        min_pct=config["tune"]["min_improvement_pct"],
        code_version=config["tune"]["code_version"],
    shell:
        logged(
            "python -m cellbench.configs --label {wildcards.label} --results results "
            "--cells {params.cells} --images-json {params.images:q} --keep {params.keep} "
            "--min-improvement-pct {params.min_pct} --code-version {params.code_version:q} "
            "--out-dir results/configs/{wildcards.label}"
        )
