# The history page of one ROCm version (cellbench.watch.page): every archived run of the label as
# time series per cell, point and metric, Otava's change points marked, each run linked to its
# archived report. Not part of `all` (it needs Apache Otava, which the bootstrap installs apart:
# docs/watch.md); `cellbench watch` asks for it after `all`, or name it:
#   snakemake results/history/LABEL/index.html --cores 1
# Its input is the label's archive receipt: a new archived run is what changes the history.


rule history:
    input:
        receipt="results/archive/{label}/ARCHIVED.json",
    output:
        page="results/history/{label}/index.html",
    log:
        "results/logs/history-{label}.log",
    benchmark:
        "results/benchmarks/history-{label}.tsv"
    conda:
        HOST_ENV
    params:
        # The report's floor: a smaller shift is not called a change point either.
        floor=config["report"]["min_change_pct"],
    shell:
        logged(
            "python -m cellbench.watch.page --label {wildcards.label} "
            "--archive-root results/archive --out-dir results/history/{wildcards.label} "
            "--min-magnitude-pct {params.floor}"
        )
