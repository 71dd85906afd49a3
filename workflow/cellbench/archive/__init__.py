"""The append-only archive (archive rule, `write`): each finished run copied with its own report
and a MANIFEST.json into a new results/archive/{label}/{run}/ folder, never rewritten.

Reads results/ through cellbench.results; writes results/archive/{label}/{run}/, the `latest`
link and the rule's receipt ARCHIVED.json. Its commands list, show, verify and diff archived
runs through the read side below it (cellbench.results.archived, cellbench.report.previous).
"""
