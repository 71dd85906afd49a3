# GSM8K gates per cell (models.NAME.gsm8k_gate): `gate` writes each cell's observation,
# gate.json, pass or fail, which the report shows; `check_gates` runs last and fails the run,
# naming model, arm, metric, value and gate, unless gates.on_failure is continue. Neither
# touches the cells' results, the report or the archive.
# One per config (its run_label): another config's check never replaces this one's record.
GATES_SUMMARY = f"results/gates/{RUN_LABEL}/SUMMARY.json"


rule gate:
    input:
        untuned=f"{CELL_DIR}/gsm8k/untuned.json",
        tuned=f"{CELL_DIR}/gsm8k/tuned.json",
        refused=refused_results,
    output:
        # update(): a refused input keeps the previous verdict (Snakemake restores it).
        update(f"{CELL_DIR}/gate.json"),
    log:
        f"{LOG_DIR}/gate.log",
    benchmark:
        f"{BENCH_DIR}/gate.tsv"
    conda:
        HOST_ENV
    params:
        # Tracked: editing a model's gate re-judges its cells (and nothing is re-measured).
        gate=lambda wildcards: json.dumps(
            model_entry(wildcards).get("gsm8k_gate"), sort_keys=True
        ),
        cell=lambda wildcards: CELL_DIR.format(**wildcards).removeprefix("results/"),
    shell:
        logged(
            "python -m cellbench.gates evaluate --cell {params.cell} --model {wildcards.model} "
            "--gate {params.gate:q} --untuned {input.untuned} --tuned {input.tuned} "
            "--out {output}"
        )


rule check_gates:
    input:
        gates=[f"{c.path}/gate.json" for c in CELLS],
        # Only for the order: the report and the archives exist before a gate fails the run.
        after=lambda wildcards: [t for t in all_targets() if t != GATES_SUMMARY],
    output:
        GATES_SUMMARY,
    log:
        "results/logs/check-gates.log",
    benchmark:
        "results/benchmarks/check-gates.tsv"
    conda:
        HOST_ENV
    params:
        on_failure=config["gates"]["on_failure"],
    shell:
        logged(
            "python -m cellbench.gates check --on-failure {params.on_failure} "
            "--results results --out {output} {input.gates}"
        )
