# Tidy tables over every cell and the PR-ready Markdown report with its diff sections.


rule report:
    input:
        cells=cell_outputs(CELLS),
        # Image comparisons interleaved on one host (serve.compare_images); none otherwise.
        compare=compare_targets(),
    output:
        report="results/report/report.md",
        serve="results/report/serve.csv",
        gsm8k="results/report/gsm8k.csv",
        tune="results/report/tune.csv",
    log:
        "results/logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    conda:
        HOST_ENV
    params:
        runtime=RUNTIME,
    shell:
        "python -m cellbench.report --results results --runtime {params.runtime} "
        "--out-dir results/report {input.cells} {input.compare} > {log} 2>&1"
