"""The GSM8K gate (gates rule, `check`): per cell, tuned against untuned per question, and the
run-wide verdict.

Reads results/{cell}/gsm8k/{arm}.json through the loaders; writes results/{cell}/gate.json
(gate.schema.json) and results/gates/{run_label}/SUMMARY.json.
"""
