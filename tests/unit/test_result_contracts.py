"""One schema check per result kind (cellbench.contracts.result_file), the same function the
writing stage calls before it writes and the loader calls after it reads: a fitting result
passes both, and a broken one is refused with the same message on either side, naming the
file, the field and what the schema expects."""

from __future__ import annotations

import copy

import pytest
from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import ResultError
from cellbench.results import loaders
from support import result_fixtures as fx

CELL = "img/m/tp1-ep1"


def test_a_fitting_bench_passes_the_check_and_the_loader(tmp_path):
    path = fx.write_bench(tmp_path, CELL, "tuned", [fx.point()])
    data = fx.bench(CELL, "tuned", [fx.point()])
    result_file.check_bench(data, path)
    assert loaders.load_bench(path, tmp_path).data == data


def test_the_writer_and_the_loader_refuse_a_bench_alike(tmp_path):
    data = fx.bench(CELL, "tuned", [fx.point()])
    del data["points"][0]["completed"]
    path = tmp_path / CELL / "serve" / "tuned" / "bench.json"
    with pytest.raises(ResultError) as written:
        result_file.check_bench(data, path)
    atomicio.write_json(path, data, checksum=True)
    with pytest.raises(ResultError) as read:
        loaders.load_bench(path, tmp_path)
    assert str(written.value) == str(read.value)
    assert written.value.field == "points[0].completed"
    assert written.value.value == "(absent)" and str(path) in str(written.value)
    assert "--forcerun" in str(written.value)


def test_gsm8k_scores_out_of_range_are_refused_before_writing(tmp_path):
    good = fx.gsm8k(CELL, "tuned", [True, False])
    path = tmp_path / CELL / "gsm8k" / "tuned.json"
    result_file.check_gsm8k(good, path)
    bad = copy.deepcopy(good)
    bad["strict_match"] = 1.5
    with pytest.raises(ResultError, match=r"strict_match = 1\.5: schema: "):
        result_file.check_gsm8k(bad, path)
