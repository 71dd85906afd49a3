"""Acceptance test of issue 19 (items 1, 3 and 6) with the real registry and real Snakemake:
an image bump followed by a rerun leaves every earlier archived run byte-identical, adds exactly
one run folder (the bumped image's), and the report gains a previous-vs-now section for exactly
the rerun cells; the dry run after the bump plans only that image's jobs, the report and its
archive.

What is real: the registry, the tags (fresh ones, moved by pushing new content), the lock and
`cellbench images bump`, Snakemake's plan, and the report and archive jobs, which Snakemake runs.
What stands in: the cells' tune, serve and GSM8K jobs. Their serve stage needs a vLLM server
image, and the test registry holds only small CPU stand-in images (.ci/docker-up.sh), so the
test writes each cell's result files itself (valid ones, through result_fixtures.py, with the
pinned digest in bench.json) and marks those jobs done with `snakemake --touch`, the way
tests/integration/test_images.py::test_bump_reruns_exactly_that_images_jobs does. After the bump
it writes
new results for the bumped image's cells only (other numbers, the new digest), as their rerun
would.
"""

from __future__ import annotations

import json

import pytest
from cellbench.archive import write as archive
from cellbench.config import loader as cbconfig
from cellbench.runtime import images
from support.archive_cells import tree_checksums, write_cell
from support.docker_env import (  # noqa: F401
    docker_client,
    fresh_tag,
    move_tag,
    registry,
    write_test_config,
)
from support.image_workflow import SNAKEFILE, _cli, _planned, _snakemake, stand_ins

# Jobs the test runs for real: the gate verdicts (host-side, from the GSM8K results), the
# report, the archives and the final gate check.
REAL_JOBS = ("gate", "report", "archive", "check_gates")


def _runs(root) -> dict[str, list[str]]:
    return {label: [r.name for r in archive.runs(root, label)] for label in ("rocm7.0", "rocm7.2")}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(not SNAKEFILE.exists(), reason="the workflow's Snakefile is not there yet")
def test_bump_adds_one_run_and_a_section_per_rerun_cell(docker_client, registry, tmp_path):  # noqa: F811
    tags = {"rocm7.0": fresh_tag(docker_client, "7.0"), "rocm7.2": fresh_tag(docker_client, "7.2")}
    lock = tmp_path / "images.lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", tags, lock=lock)
    assert _cli(cfg, lock, "lock").returncode == 0
    cells = {c.cell_id: c for c in cbconfig.cells(cbconfig.load(cfg))}
    bumped = sorted(c for c in cells if c.startswith("rocm7.2/"))
    kept = sorted(c for c in cells if c.startswith("rocm7.0/"))
    assert bumped and kept
    full = _planned(tmp_path, cfg)

    # A finished run: valid results for every cell, every other output present, and every job
    # marked done (its params, the pinned digest among them, recorded) by --touch.
    res, root = tmp_path / "results", tmp_path / "results" / "archive"
    pins = images.load_lock(lock)
    old = images.pinned_digest(pins, "rocm7.2")
    stand_ins(tmp_path, cfg)
    for cell in cells:
        write_cell(res, cell, digest=images.pinned_digest(pins, cell.split("/")[0]))
    _snakemake(tmp_path, cfg, "--touch", "--forceall", "--cores", "1")
    # The gates, the report and both archives for real, then the jobs after them marked done.
    targets = ["results/report/test-docker/INDEX.json"]
    targets += [f"results/archive/{label}/ARCHIVED.json" for label in ("rocm7.0", "rocm7.2")]
    _snakemake(
        tmp_path, cfg, "--cores", "1", "--forcerun", "gate", "report", "archive", "--", *targets
    )
    _snakemake(tmp_path, cfg, "--touch", "--cores", "1")
    assert _planned(tmp_path, cfg) == set()
    before = _runs(root)
    assert [len(v) for v in before.values()] == [1, 1]
    earlier = {label: tree_checksums(root / label / names[0]) for label, names in before.items()}
    assert ": previous run" not in (res / "report/test-docker/report.md").read_text()

    # The bump: the tag moves, and the lock follows it only through `cellbench images bump`.
    new = move_tag(docker_client, tags["rocm7.2"])
    assert _cli(cfg, lock, "bump", "rocm7.2").returncode == 0
    assert images.pinned_digest(images.load_lock(lock), "rocm7.2") == new != old

    # Item 6: the plan holds rocm7.2's jobs (its archive among them), the report, nothing else.
    after = _planned(tmp_path, cfg)
    assert ("archive", "results/archive/rocm7.2/ARCHIVED.json") in after
    assert not any("rocm7.0" in out for _, out in after)
    expected = {job for job in full if "/rocm7.2/" in job[1]}
    expected |= {job for job in full if job[0] in ("all", "report", "check_gates")}
    assert after == expected

    # The rerun of rocm7.2's cells, as their jobs would leave it: new numbers, the new digest.
    for cell in bumped:
        write_cell(res, cell, ttft=150.0, digest=new)
    _snakemake(tmp_path, cfg, "--touch", "--cores", "1", "--omit-from", *REAL_JOBS)
    remaining = _planned(tmp_path, cfg)
    assert {rule for rule, _ in remaining} <= {"all", *REAL_JOBS}
    # What remains of `all`, for real.
    _snakemake(tmp_path, cfg, "--cores", "1", "all")

    runs = _runs(root)
    assert runs["rocm7.0"] == before["rocm7.0"]
    assert len(runs["rocm7.2"]) == 2 and runs["rocm7.2"][0] == before["rocm7.2"][0]
    for label, names in before.items():  # every earlier run folder, byte for byte
        assert tree_checksums(root / label / names[0]) == earlier[label]
    newest = runs["rocm7.2"][1]
    assert json.loads((root / "rocm7.2/ARCHIVED.json").read_text())["run"] == newest
    manifest = json.loads((root / "rocm7.2" / newest / "MANIFEST.json").read_text())
    assert manifest["images"] == {"rocm7.2": new} and sorted(manifest["cells"]) == bumped
    assert archive.main(["verify", "--archive-root", str(root)]) == 0

    text = (res / "report/test-docker/report.md").read_text()
    headings = [line for line in text.splitlines() if ": previous run " in line]
    assert sorted(h.split(":")[0].removeprefix("## ") for h in headings) == bumped
    first_run = f"rocm7.2/{before['rocm7.2'][0]}"
    for heading in headings:
        assert f"previous run {first_run} (digest {old}) vs now (digest {new})" in heading
    assert text.count("Image bump: A is the run archived as") == len(bumped)
