# Optional aggregate (serve.compare_images): the tuned arm of two images' cells of one
# (model, tp, ep), served side by side on one host and alternated repeat by repeat (A B, B A,
# ...), so drift of the machine weighs on both images. It is kept apart from the per-cell jobs:
# bumping one image's pin reruns only that image's cells there, while a comparison, which
# measures both images, reruns when either pin moves (both digests are its params).


rule compare_images:
    input:
        unpack(compare_inputs),
        refused=refused_results,
    output:
        bench=f"results/compare/{COMPARE_ID}/bench.json",
    log:
        f"results/logs/compare/{COMPARE_ID}/compare-images.log",
    benchmark:
        f"results/benchmarks/compare/{COMPARE_ID}/compare-images.tsv"
    conda:
        HOST_ENV
    threads: MEASURING_THREADS
    resources:
        # Two servers of TP GPUs each, alive together.
        gpu=lambda wildcards: 2 * gpus_for(wildcards),
    params:
        # Tracked: both pins and the load grid. The whole job names input folders, so it
        # is built untracked (compare_args) from the same values.
        settings=compare_settings,
        args=compare_args,
        out=lambda wildcards, output: str(Path(output.bench).parent),
    shell:
        logged("python -m cellbench.serve --job {params.args:q} --out-dir {params.out}")
