"""Statistics every verdict uses: Welch over repeats with Holm per table (`core`), the one
better/worse/within-noise comparison (`comparison`), noise models and repeat counts (`noise`,
`calibration`), the sequential stopping rule (`sequential`) and MLPerf's early stopping for
percentile claims (`early_stopping`).

Reads and writes no files: numbers in, verdicts out. Used by the gates, the report and the archive.
"""
