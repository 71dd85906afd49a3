"""Print the part of a failed job's log that says why it failed.

Snakemake reports a failed job as "check log file(s)"; the rules' shells (``logged()`` in
workflow/rules/common.smk) call this on failure so the reason also reaches the terminal:

    python -m cellbench.joblog LOG

What counts as the reason: the last Python traceback's final lines (the exception), or lines
that say error/failed/refused, plus the log's last few lines for context.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_ERROR_RE = re.compile(
    r"(error|exception|failed|refus|not found|no such|denied|killed|cannot|unable)", re.I
)
# Lines that carry no reason of their own (progress bars, blank lines).
_NOISE_RE = re.compile(r"^\s*$|\d+%\|")


def meaningful_tail(text: str, max_lines: int = 20) -> list[str]:
    """The lines that explain a failure, in log order, at most ``max_lines``."""
    lines = [line.rstrip() for line in text.splitlines() if not _NOISE_RE.search(line)]
    if not lines:
        return []
    last_tb = max((i for i, line in enumerate(lines) if line.startswith("Traceback")), default=-1)
    if last_tb >= 0:
        # The exception closes the traceback: keep it, and what follows it.
        tail = lines[last_tb:]
        frames_end = next(
            (i for i, line in enumerate(tail) if i > 0 and not line.startswith((" ", "\t"))),
            len(tail),
        )
        picked = [tail[0], *tail[max(1, frames_end - 2) : frames_end], *tail[frames_end:]]
        return picked[-max_lines:]
    errors = [i for i, line in enumerate(lines) if _ERROR_RE.search(line)]
    keep = set(errors[-(max_lines // 2) :]) | set(range(max(0, len(lines) - 5), len(lines)))
    return [lines[i] for i in sorted(keep)][-max_lines:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m cellbench.joblog LOG", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        print(f"cellbench: the job failed and its log {path} cannot be read ({exc})")
        return 0
    lines = meaningful_tail(text)
    print(f"cellbench: the job failed; from its log {path}:")
    for line in lines or ["(the log is empty)"]:
        print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
