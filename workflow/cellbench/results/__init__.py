"""The read side of every stage's results: one checked loader per result kind (`loaders`:
checksum, schema, the invariants a schema cannot say) and the archive's run folders as the
report finds them (still in cellbench.archive.write).

Reads results/ and results/archive/; writes nothing. `python -m cellbench.results FILE...` checks
files by hand.
"""
