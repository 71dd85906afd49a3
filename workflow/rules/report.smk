# Per cell, its figures (cellbench.report.plots); then tidy tables over every cell and the PR-ready
# Markdown report with its diff sections and links to the figures.
# Every input is checked (cellbench.results.loaders) before use. The report is built in a temporary
# folder and swapped in whole, INDEX.json written last and the plots folder carried over. Its
# user-facing files are update() outputs: Snakemake, which deletes a job's outputs before it
# runs and after it fails, then keeps them and restores them after a failure, so a failed
# report leaves the previous one in place; INDEX.json alone goes, so the next run redoes it.
# Both read results/archive (not an input: the archive jobs run beside them) for each cell's
# previous archived run with other results: a previous-vs-now section and the bump figure.
# Everything a person reads is marked for `snakemake --report`: one category per cell (plus
# "All cells"), one subcategory per stage, a caption per kind in workflow/report/.


rule plots:
    input:
        summary=f"{CELL_DIR}/tune/summary.json",
        bench=expand(
            f"{CELL_DIR}/serve/{{arm}}/bench.json", arm=ARMS, allow_missing=True
        ),
        gsm8k=expand(f"{CELL_DIR}/gsm8k/{{arm}}.json", arm=ARMS, allow_missing=True),
    output:
        **plot_outputs(),
    log:
        f"{LOG_DIR}/plots.log",
    benchmark:
        f"{BENCH_DIR}/plots.tsv"
    conda:
        HOST_ENV
    params:
        cell=lambda wildcards: CELL_DIR.format(**wildcards).removeprefix("results/"),
        out_dir=lambda wildcards: PLOT_DIR.format(**wildcards),
        # Tracked: the floor colours the verdicts of arm_change and bump.
        settings=f"--min-change-pct {config['report']['min_change_pct']}",
    shell:
        logged(
            "python -m cellbench.report.plots --results results --cell {params.cell} "
            "--out-dir {params.out_dir} --archive-root results/archive {params.settings}"
        )


rule report:
    input:
        cells=cell_outputs(CELLS),
        # Image comparisons interleaved on one host (serve.compare_images); none otherwise.
        compare=compare_targets(),
        # Each cell's GSM8K gate verdict (cellbench.gates.check), shown under its GSM8K table.
        gates=[f"{c.path}/gate.json" for c in CELLS],
        # Linked from report.md (not read by the report code).
        plots=cell_plot_files(CELLS),
    output:
        index=f"{REPORT_DIR}/INDEX.json",
        markdown=report_table(f"{REPORT_DIR}/report.md", "report_md"),
        serve=report_table(f"{REPORT_DIR}/serve.csv", "serve_csv"),
        gsm8k=report_table(f"{REPORT_DIR}/gsm8k.csv", "gsm8k_csv"),
        tune=report_table(f"{REPORT_DIR}/tune.csv", "tune_csv"),
        tidy_csv=report_table(f"{REPORT_DIR}/tidy.csv", "tidy"),
        tidy_parquet=report_table(f"{REPORT_DIR}/tidy.parquet", "tidy"),
        compare=(
            [report_table(f"{REPORT_DIR}/compare.csv", "compare_csv")]
            if compare_targets()
            else []
        ),
        # One PR-ready Markdown file per model (cellbench.report.pr_markdown).
        pr=[
            report_table(f"{REPORT_DIR}/pr/{model}.md", "pr_markdown")
            for model in sorted({c.model for c in CELLS})
        ],
    log:
        "results/logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    conda:
        HOST_ENV
    params:
        runtime=RUNTIME,
        # Tracked: the floor changes verdicts and the latency bounds the percentile claims,
        # so an edit reruns the report (only). Their table, percentile_claims.csv, is not an
        # output: a declared output that a finished run lacks would keep Snakemake from
        # comparing these params at all (tests/workflow/test_latency_bounds_rerun.py).
        settings=jobargs.report_settings(config),
        out_dir=lambda wildcards, output: str(Path(output.index).parent),
        run_label=RUN_LABEL,
    shell:
        logged(
            "python -m cellbench.report --results results --runtime {params.runtime} "
            "--run-label {params.run_label} "
            "{params.settings} --archive-root results/archive "
            "--out-dir {params.out_dir} {input.cells} {input.gates} {input.compare}"
        )
