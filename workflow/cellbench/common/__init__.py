"""Shared ground every stage stands on: atomic writes with checksums (`atomicio`), the repository's
paths (`paths`), the secret names passed through and never logged (`secrets`) and the git state a
report or archive records (`gitstate`).

Reads and writes no stage's results itself. Standard library only: the tuner imports `atomicio`
inside the vLLM image.
"""
