"""The bisect's search (cellbench.watch.search), its refs (candidates) and its state file's
resume rule, on plain data: no registry, no server."""

from __future__ import annotations

import json
import math

import pytest
from cellbench.watch import bisect, candidates, search


def walk(n: int, first_bad: int, skipped: frozenset[int] = frozenset()) -> search.Search:
    """Run the search over n refs whose first bad one is ``first_bad``; ``skipped`` cannot be
    measured."""
    s = search.Search([f"r{i}" for i in range(n)])
    while (i := s.next()) is not None:
        s.record(
            i, search.SKIP if i in skipped else (search.BAD if i >= first_bad else search.GOOD)
        )
    return s


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 9, 16, 17, 33, 100])
def test_every_first_bad_is_found_within_the_bound(n):
    bound = math.ceil(math.log2(n)) + 1
    assert search.max_steps(n) <= bound
    for first_bad in range(1, n):
        s = walk(n, first_bad)
        assert s.answer()["first_bad"] == first_bad
        assert s.steps_taken() <= search.max_steps(n), (n, first_bad, s.outcomes)


def test_the_bad_ref_is_measured_first_and_a_bad_that_does_not_reproduce_ends_it():
    s = search.Search(["good", "a", "b", "bad"])
    assert s.next() == 3
    s.record(3, search.GOOD)
    assert s.done()
    answer = s.answer()
    assert answer["first_bad"] is None and "did not measure worse" in answer["why"]


def test_a_skipped_candidate_is_stepped_around():
    # first bad at 5; 6, the middle of the second step, cannot be served: the next step
    # takes the untried candidate nearest the middle instead, and 5 is still named
    s = walk(9, 5, frozenset({6}))
    assert s.outcomes[6] == search.SKIP
    assert s.answer()["first_bad"] == 5


def test_a_skipped_candidate_next_to_the_change_leaves_a_range():
    s = walk(6, 3, frozenset({2}))
    answer = s.answer()
    assert answer["first_bad"] is None
    assert answer["range"] == [2, 3]
    assert "skipped" in answer["why"]


def test_outcomes_are_checked():
    s = search.Search(["g", "b"])
    with pytest.raises(ValueError, match="expected one of"):
        s.record(1, "maybe")
    with pytest.raises(ValueError, match="at least 2"):
        search.max_steps(1)
    with pytest.raises(ValueError, match="repeat"):
        search.Search(["g", "g"])


def test_window_refuses_unknown_refs_and_a_good_not_older_than_bad():
    refs = ["r:n1", "r:n2", "r:n3"]
    assert candidates.window(refs, "r:n1", "r:n3") == refs
    with pytest.raises(candidates.CandidateError, match="not older than"):
        candidates.window(refs, "r:n3", "r:n1")
    with pytest.raises(candidates.CandidateError, match="not older than"):
        candidates.window(refs, "r:n2", "r:n2")
    with pytest.raises(candidates.CandidateError, match="--good r:n0: not among"):
        candidates.window(refs, "r:n0", "r:n3")


def test_nightly_tags_are_ordered_by_their_date_group_and_a_pattern_must_match():
    tags = ["nightly-20261203", "latest", "nightly-20261201", "nightly-20261202", "0.31.0"]
    pattern = r"nightly-(?P<date>\d{8})"
    assert candidates.nightly_tags(tags, pattern) == [
        "nightly-20261201", "nightly-20261202", "nightly-20261203"]  # fmt: skip
    with pytest.raises(candidates.CandidateError, match="matches none"):
        candidates.nightly_tags(tags, r"rc-(?P<date>\d{8})")
    with pytest.raises(candidates.CandidateError, match="not a regular expression"):
        candidates.nightly_tags(tags, "(")


def test_resume_with_other_arguments_is_refused(tmp_path):
    setting = {"image": "img", "refs": ["r:1", "r:2", "r:3"], "cell": "c", "repeats": 3}
    state = bisect._new_state(setting, ["sha256:" + "a" * 64] * 3)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert bisect.load_state(path, setting, abandon=False)["session"] == state["session"]
    other = {**setting, "refs": ["r:2", "r:3"]}
    with pytest.raises(bisect.BisectError, match=r"differ in: refs.*--abandon"):
        bisect.load_state(path, other, abandon=False)
    assert bisect.load_state(path, other, abandon=True) is None
    path.write_text(json.dumps({**state, "done": True}))
    assert bisect.load_state(path, other, abandon=False) is None


def test_the_exhaustive_walk_measures_every_candidate_and_agrees_with_the_search():
    for n in (2, 5, 9):
        for first_bad in range(1, n):
            w = search.Walk([f"r{i}" for i in range(n)])
            while (i := w.next()) is not None:
                w.record(i, search.BAD if i >= first_bad else search.GOOD)
            assert w.steps_taken() == n - 1
            assert w.answer()["first_bad"] == walk(n, first_bad).answer()["first_bad"]
