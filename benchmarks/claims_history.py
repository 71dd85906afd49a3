"""Claims for docs/benchmark-history.md and docs/design.md: rows of doc_figures.Claim's fields.

Each row is (page, quote, source, evidence) or (page, quote, source, evidence, commit); see
doc_figures.py for what each field means.
"""

ROWS: list[tuple[str, ...]] = []
