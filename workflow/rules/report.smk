# Tidy tables over every cell and the PR-ready Markdown report with its diff sections.
# Every input is checked (cellbench.results) before use. The report is built in a temporary
# folder and swapped in whole; the declared output is its INDEX.json, written last, so that
# Snakemake, which deletes a job's outputs before it runs and after it fails, never deletes
# the report a user reads: a failed report leaves the previous one in place.
# It reads results/archive (not an input: the archive jobs run beside it) for each cell's
# previous archived run with other results, and adds a previous-vs-now section for it.


rule report:
    input:
        cells=cell_outputs(CELLS),
        # Image comparisons interleaved on one host (serve.compare_images); none otherwise.
        compare=compare_targets(),
        # Each cell's GSM8K gate verdict (cellbench.gates), shown under its GSM8K table.
        gates=[f"{c.path}/gate.json" for c in CELLS],
    output:
        index="results/report/INDEX.json",
    log:
        "results/logs/report.log",
    benchmark:
        "results/benchmarks/report.tsv"
    conda:
        HOST_ENV
    params:
        runtime=RUNTIME,
        # Tracked: the floor changes verdicts, so an edit reruns the report (only).
        settings=f"--min-change-pct {config['report']['min_change_pct']}",
    shell:
        logged(
            "python -m cellbench.report --results results --runtime {params.runtime} "
            "{params.settings} --archive-root results/archive "
            "--out-dir results/report {input.cells} {input.gates} {input.compare}"
        )
