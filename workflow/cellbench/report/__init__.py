"""The report (report rule): `build` loads the checked results into frames and writes report.md
and INDEX.json; `tidy` (CSV/Parquet), `plots` (figures per cell) and `pr_markdown` (one PR
file per model) render from build's frames. (Still to do, issue 31 item 2: the frames in a
module of their own at the bottom, so that build, plots and pr_markdown stop importing each
other, and the previous-run comparisons moved here from cellbench.archive.write.)

Reads results/ through cellbench.results (and results/archive/ for the previous run); writes
results/report/ (swapped in whole; INDEX.json last) and results/report/plots/{cell}/.
"""
