"""The bisect's search: which candidate to measure next, when it is done, and its step bound.

Candidates are ordered oldest first: index 0 is the good reference, the last the bad one. The
first step measures the bad one against the good (the regression must reproduce), then each
step halves the range between the newest good and the oldest bad. A candidate that could not
be measured (pull, start or serve failed) is skipped, as ``git bisect skip`` does: the next
step takes the untried candidate nearest the middle, and when only skipped ones remain the
answer is a range, not one image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GOOD, BAD, SKIP = "good", "bad", "skip"
OUTCOMES = (GOOD, BAD, SKIP)


def max_steps(n_candidates: int) -> int:
    """The most steps a bisect over ``n_candidates`` refs (good and bad included) takes when
    nothing is skipped: one to confirm the bad ref, then a binary search over the
    ``n_candidates - 1`` places the first bad one can be: ceil(log2(n - 1)) + 1."""
    if n_candidates < 2:
        raise ValueError(f"a bisect needs at least 2 refs (good and bad), got {n_candidates}")
    return math.ceil(math.log2(n_candidates - 1)) + 1


@dataclass
class Search:
    candidates: list[str]
    outcomes: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.candidates) < 2:
            raise ValueError("a bisect needs a good and a bad ref")
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError("the candidates repeat a ref")
        self.outcomes[0] = GOOD  # the good reference is good by definition
        for index, outcome in self.outcomes.items():
            if outcome not in OUTCOMES or not 0 <= index < len(self.candidates):
                raise ValueError(f"outcome {index}={outcome!r} is not one of {OUTCOMES}")

    @property
    def last(self) -> int:
        return len(self.candidates) - 1

    def record(self, index: int, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: expected one of {', '.join(OUTCOMES)}")
        if index in self.outcomes and index != self.last:
            raise ValueError(f"candidate {index} ({self.candidates[index]}) is already measured")
        self.outcomes[index] = outcome

    def bounds(self) -> tuple[int, int]:
        """(newest good, oldest bad after it)."""
        lo = max(i for i, o in self.outcomes.items() if o == GOOD)
        bads = [i for i, o in self.outcomes.items() if o == BAD and i > lo]
        return lo, min(bads) if bads else self.last

    def next(self) -> int | None:
        """The candidate to measure next, or None when the search is over."""
        if self.outcomes.get(self.last) is None:
            return self.last  # confirm the regression first
        if self.outcomes[self.last] != BAD:
            return None  # the bad ref did not reproduce (or could not be measured)
        lo, hi = self.bounds()
        open_ = [i for i in range(lo + 1, hi) if i not in self.outcomes]
        if not open_:
            return None
        middle = (lo + hi) / 2
        return min(open_, key=lambda i: (abs(i - middle), i))

    def done(self) -> bool:
        return self.next() is None

    def answer(self) -> dict:
        """What the search found: ``first_bad`` (an index) when one image is named, else
        ``range`` (the indices it could be, skipped ones in between) and ``why``."""
        if not self.done():
            raise ValueError("the search is not over")
        end = self.outcomes[self.last]
        if end != BAD:
            why = (
                "the bad ref did not measure worse than the good one"
                if end == GOOD
                else "the bad ref could not be measured"
            )
            return {"first_bad": None, "range": [], "why": why}
        lo, hi = self.bounds()
        skipped = [i for i in range(lo + 1, hi) if self.outcomes.get(i) == SKIP]
        if skipped:
            return {
                "first_bad": None,
                "range": [*skipped, hi],
                "why": f"{len(skipped)} skipped candidate(s) lie between the last good and "
                "the first bad one: any of these is the first bad image",
            }
        return {"first_bad": hi, "range": [hi], "why": "the newest good is right before it"}

    def steps_taken(self) -> int:
        return len(self.outcomes) - 1  # the good reference's outcome is given, not measured


@dataclass
class Walk(Search):
    """Every candidate in turn against the good reference, oldest first: the check a bisect's
    answer is held against (n - 1 steps)."""

    def next(self) -> int | None:
        untried = [i for i in range(1, len(self.candidates)) if i not in self.outcomes]
        return untried[0] if untried else None

    def answer(self) -> dict:
        if not self.done():
            raise ValueError("the walk is not over")
        bad = sorted(i for i, o in self.outcomes.items() if o == BAD)
        if not bad:
            return {"first_bad": None, "range": [], "why": "no candidate measured worse"}
        first = bad[0]
        skipped = [i for i in range(1, first) if self.outcomes.get(i) == SKIP]
        if skipped:
            return {"first_bad": None, "range": [*skipped, first],
                    "why": "skipped candidates lie before the first bad one"}  # fmt: skip
        return {"first_bad": first, "range": [first], "why": "every older candidate was good"}
