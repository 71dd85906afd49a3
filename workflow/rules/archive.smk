# A finished run added to an append-only archive per ROCm version (cellbench.archive.write): a new
# folder results/archive/{label}/{run}/ with its manifest, built aside and renamed into place;
# earlier run folders are never written. It takes only its own cells (and writes their report
# itself), so bumping one image's pin never reruns another version's archive. The declared
# output is a receipt, ARCHIVED.json (which run this job added or found, written last): the
# run folder cannot be the output, since Snakemake deletes a job's outputs before it runs and
# after it fails, and nothing else in the label folder depends on the receipt.


rule archive:
    input:
        cells=lambda wildcards: cell_outputs(cells_with_label(wildcards.label)),
        # The cells' GSM8K gate verdicts travel with their results.
        gates=lambda wildcards: [
            f"{c.path}/gate.json" for c in cells_with_label(wildcards.label)
        ],
    output:
        "results/archive/{label}/ARCHIVED.json",
    log:
        "results/logs/archive-{label}.log",
    benchmark:
        "results/benchmarks/archive-{label}.tsv"
    conda:
        HOST_ENV
    params:
        cells=lambda wildcards: " ".join(
            c.cell_id for c in cells_with_label(wildcards.label)
        ),
        digests=lambda wildcards: " ".join(
            sorted(
                {
                    f"{c.image}={PINS.digest(c.image)}"
                    for c in cells_with_label(wildcards.label)
                }
            )
        ),
        # The tracked settings of its cells only: a timeout edit archives nothing new.
        config_hash=archive_settings_hash,
    shell:
        logged(
            "python -m cellbench.archive build --label {wildcards.label} --results results "
            "--cells {params.cells} --digests {params.digests} "
            "--config-hash {params.config_hash} --archive-root results/archive"
        )
