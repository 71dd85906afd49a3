# A finished run copied into an archive per ROCm version, with a manifest that pins it down.
# It takes only its own cells (and writes their report itself), so bumping one image's pin
# never reruns another version's archive. Like the report, it is built in a temporary folder
# and swapped in whole; the declared output is INDEX.json, written last, so a failed archive
# leaves the previous one with its MANIFEST.json.


rule archive:
    input:
        cells=lambda wildcards: cell_outputs(cells_with_label(wildcards.label)),
    output:
        "results/archive/{label}/INDEX.json",
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
            "python -m cellbench.archive --label {wildcards.label} --results results "
            "--cells {params.cells} --digests {params.digests} "
            "--config-hash {params.config_hash} --out-dir results/archive/{wildcards.label}"
        )
