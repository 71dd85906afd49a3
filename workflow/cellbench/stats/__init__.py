"""Statistics every verdict uses: serving comparisons with server starts as the unit of
replication and variance components measured from the data (`starts`), the group-sequential
rule that stops starts once the answer is known (`sequential`), the one comparison of two
sides (`comparison`), GSM8K's paired tests (`core`), noise models fitted to real runs and
error rates simulated on them (`noise`, `calibration`) and MLPerf's early stopping for
percentile claims (`early_stopping`).

Reads no files but the bench.json files a prior is built from (`starts.prior_from_benches`):
numbers in, verdicts out. Used by the serve stage, the gates, the report and the archive.
"""
