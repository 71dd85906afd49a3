"""The read side of every stage's results: one checked loader per result kind (`loaders`:
checksum, schema, the invariants a schema cannot say; what they share is
`cellbench.contracts.result_file`), whether a
set of cells is whole (`whole_sets`) and the archive's run folders as the report and the
archive's commands read them (`archived`; the writer is cellbench.archive).

Reads results/ and results/archive/; writes nothing. `python -m cellbench.results FILE...` checks
files by hand.
"""
