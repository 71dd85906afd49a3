"""Which present results the workflow forces again (cellbench.results.refused), and the
checksum of lm-eval's output folder (atomicio.write_tree_checksum, tree_problem)."""

from __future__ import annotations

from cellbench.common import atomicio
from cellbench.results import refused
from support import result_fixtures as fx

CELL = "host-cpu/tiny-qwen3-moe/tp1-ep1"


def test_whole_or_absent_results_are_not_refused(tmp_path):
    res = tmp_path / "results"
    bench = fx.write_bench(res, CELL, "tuned", [fx.point(seq=0)])
    absent = res / CELL / "gsm8k" / "tuned.json"
    assert refused.refused([bench, absent], res) == []


def test_a_result_without_its_checksum_is_refused(tmp_path):
    res = tmp_path / "results"
    bench = fx.write_bench(res, CELL, "tuned", [fx.point(seq=0)])
    atomicio.checksum_path(bench).unlink()
    ((path, why),) = refused.refused([bench], res)
    assert path == str(bench) and "(sha256) = (no checksum recorded)" in why


def test_lm_eval_folder_checked_against_what_was_recorded(tmp_path):
    folder = tmp_path / "serve" / "tuned" / "lm_eval"
    (folder / "instance-1").mkdir(parents=True)
    (folder / "instance-1" / "results.json").write_text("{}")
    atomicio.write_tree_checksum(folder)
    assert refused.problem(folder) is None
    (folder / ".snakemake_timestamp").write_text("")  # Snakemake's marker: not a result
    assert refused.problem(folder) is None
    (folder / "instance-1" / "results.json").write_text('{"x": 1}')
    assert "instance-1/results.json changed after it was written" in refused.problem(folder)
    (folder / "instance-1" / "results.json").write_text("{}")
    (folder / "extra.json").write_text("{}")
    assert "extra.json is not in lm_eval.sha256" in refused.problem(folder)
    (folder / "extra.json").unlink()
    (folder / "instance-1" / "results.json").unlink()
    assert "instance-1/results.json is gone" in refused.problem(folder)
    atomicio.tree_checksum_path(folder).unlink()
    assert "no checksum recorded (lm_eval.sha256 is missing)" in refused.problem(folder)
    folder_file = tmp_path / "other" / "lm_eval"
    folder_file.parent.mkdir()
    folder_file.write_text("not a folder")
    assert "a folder of lm-eval's output expected" in refused.problem(folder_file)
