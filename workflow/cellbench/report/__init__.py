"""The report (report rule), in layers that import only downward: `frames` (the checked results
loaded into tables; the bottom, every renderer reads it) and `comparison_tables` (the one
comparison's rows as Markdown) < `tidy` (CSV/Parquet) and
`sections` (report.md's sections per cell) and `percentile_claims` (latency bounds per point
and arm, from the per-request files) < `plots`
(figures per cell) and `previous` (a cell against its previous archived run; two archived runs
against each other) < `pr_markdown` (one PR file per model, linking the plots) < `build`
(report.md and INDEX.json, the report job).

Reads results/ through cellbench.results (each arm's requests.jsonl.gz beside its bench.json
where report.latency_bounds is set; and results/archive/ through
cellbench.results.archived for the previous run); writes results/report/RUN_LABEL/ (swapped in
whole; INDEX.json last) and results/report/RUN_LABEL/plots/{cell}/.
"""
