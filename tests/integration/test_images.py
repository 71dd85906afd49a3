"""Image pins: the lock file, and lock/status/bump/pull against the local registry."""

from __future__ import annotations

import io
import re

import pytest
import yaml
from cellbench.config import images_command
from cellbench.config import loader as cbconfig
from cellbench.runtime import images
from cellbench.runtime.images import ImageError, ImageRef
from support.archive_cells import write_cell
from support.docker_env import (  # noqa: F401
    PYTHON,
    REPO_ROOT,
    TEST_REPO,
    docker_client,
    fresh_tag,
    move_tag,
    registry,
    write_test_config,
)
from support.image_workflow import SNAKEFILE, _cli, _planned, _snakemake, stand_ins  # noqa: F401

DIGEST = "sha256:" + "ab" * 32

# --- without the engine --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "repo", "tag", "digest"),
    [
        ("127.0.0.1:5000/a/b:rocm7.2", "127.0.0.1:5000/a/b", "rocm7.2", None),
        ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b", None, None),
        (f"docker.io/rocm/vllm@{DIGEST}", "docker.io/rocm/vllm", None, DIGEST),
        (f"rocm/vllm:nightly@{DIGEST}", "rocm/vllm", "nightly", DIGEST),
    ],
)
def test_parse_reference(ref, repo, tag, digest):
    parsed = ImageRef.parse(ref)
    assert (parsed.repository, parsed.tag, parsed.digest) == (repo, tag, digest)
    assert str(parsed) == ref


@pytest.mark.parametrize("ref", ["", "a b:c", "repo@md5:abc"])
def test_bad_reference(ref):
    with pytest.raises(ImageError):
        ImageRef.parse(ref)


def test_lock_round_trip_and_pinned_ref(tmp_path):
    path = tmp_path / "lock.yaml"
    assert images.load_lock(path)["images"] == {}
    lock = {"images": {"rocm7.2": {"ref": "127.0.0.1:5000/x:rocm7.2", "digest": DIGEST}}}
    images.save_lock(path, lock)
    back = images.load_lock(path)
    assert images.pinned_digest(back, "rocm7.2") == DIGEST
    assert images.pinned_ref(back, "rocm7.2") == f"127.0.0.1:5000/x@{DIGEST}"
    with pytest.raises(KeyError, match="rocm7.0"):
        images.pinned_ref(back, "rocm7.0")
    assert not [p for p in tmp_path.iterdir() if p.name != "lock.yaml"]  # no temp left


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("images: [1, 2]", "expected a mapping"),
        ("images:\n  a: {ref: x}\n", r"images\.a\.digest is missing"),
        ("images:\n  a: {ref: x, digest: 'md5:1'}\n", r"images\.a\.digest = 'md5:1'"),
        ("images: {a: [}", "not valid YAML"),
    ],
)
def test_malformed_lock_names_the_key(tmp_path, text, match):
    path = tmp_path / "lock.yaml"
    path.write_text(text)
    with pytest.raises(ImageError, match=match):
        images.load_lock(path)


@pytest.mark.parametrize(
    ("declared", "found", "ok"),
    [
        ("7.0", "7.0.2-56", True),
        ("7.0", "7.0", True),
        ("7.0", "7.2.0", False),
        ("7.0", "17.0", False),
        ("7.2", "7.20", False),
    ],
)
def test_rocm_version_match(declared, found, ok):
    assert images.rocm_matches(declared, found) is ok


def test_rocm_mismatch_and_missing_are_errors():
    with pytest.raises(ImageError, match="declares rocm_version '7.2' but the image holds"):
        images.check_rocm("rocm7.2", "7.2", "7.0.0")
    with pytest.raises(ImageError, match="has no /opt/rocm/.info/version"):
        images.check_rocm("rocm7.2", "7.2", None)
    images.check_rocm("cuda", None, None)  # no declaration: nothing to check


def test_bad_config_fails_before_the_engine(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runtime: docker\nimages: {}\n")
    assert images_command.main(["--configfile", str(cfg), "status"]) == 2
    assert "config error" in capsys.readouterr().err


def test_unknown_image_for_bump(tmp_path, capsys):
    cfg = write_test_config(tmp_path / "c.yaml", {}, lock=tmp_path / "lock.yaml")
    rc = images_command.main(["--configfile", str(cfg), "bump", "rocm9.9"])
    err = capsys.readouterr().err
    assert (
        rc == 2 and "image 'rocm9.9' is not defined under images (known: rocm7.0, rocm7.2)" in err
    )


# --- against the local registry ------------------------------------------------------------


@pytest.mark.docker
def test_lock_status_bump_follow_a_moved_tag_only_when_asked(docker_client, registry, tmp_path):  # noqa: F811
    tags = {"rocm7.0": fresh_tag(docker_client, "7.0"), "rocm7.2": fresh_tag(docker_client, "7.2")}
    lock = tmp_path / "images.lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", tags, lock=lock)

    r = _cli(cfg, lock, "lock")
    assert r.returncode == 0, r.stderr
    pins = yaml.safe_load(lock.read_text())["images"]
    for name, tag in tags.items():
        assert pins[name]["digest"] == docker_client.images.get_registry_data(tag).id
        assert pins[name]["ref"] == tag
        assert pins[name]["resolved_at"].endswith("Z")
    assert pins["rocm7.0"]["rocm_version"] == "7.0"
    assert pins["rocm7.2"]["rocm_version"] == "7.2"

    r = _cli(cfg, lock, "status")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("\tcurrent\t") == 2

    old = pins["rocm7.2"]["digest"]
    new = move_tag(docker_client, tags["rocm7.2"])
    assert new != old
    r = _cli(cfg, lock, "status")
    assert r.returncode == 3
    lines = {line.split("\t")[0]: line for line in r.stdout.splitlines() if "\t" in line}
    assert "\tmoved\t" in lines["rocm7.2"] and f"tag-now={new}" in lines["rocm7.2"]
    assert "\tcurrent\t" in lines["rocm7.0"]

    # Neither lock nor the pinned ref follows the moved tag.
    assert _cli(cfg, lock, "lock").returncode == 0
    assert images.pinned_digest(images.load_lock(lock), "rocm7.2") == old

    r = _cli(cfg, lock, "bump", "rocm7.2")
    assert r.returncode == 0, r.stderr
    assert f"rocm7.2: {old} -> {new}" in r.stdout
    after = images.load_lock(lock)
    assert images.pinned_digest(after, "rocm7.2") == new
    assert images.pinned_digest(after, "rocm7.0") == pins["rocm7.0"]["digest"]
    assert _cli(cfg, lock, "status").returncode == 0


@pytest.mark.docker
def test_a_registry_that_does_not_answer_has_its_own_exit_status(docker_client, tmp_path):  # noqa: F811
    """Nothing listens on port 1: the engine's connection is refused for real. status exits 4
    (not 3, which says a tag moved), and lock fails with 4 whether the image is pinned or not
    (it used to say "nothing to pin" with exit 0 when every image had a pin)."""
    down = {
        "rocm7.0": "127.0.0.1:1/cellbench/down:7.0",
        "rocm7.2": "127.0.0.1:1/cellbench/down:7.2",
    }
    lock = tmp_path / "lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", down, lock=lock)
    r = _cli(cfg, lock, "status")
    assert r.returncode == images.EXIT_UNREACHABLE == 4, r.stdout + r.stderr
    assert r.stdout.count("\tunreachable\t") == 2 and "registry unreachable" in r.stdout
    r = _cli(cfg, lock, "lock")
    assert r.returncode == 4 and "registry unreachable" in r.stderr, r.stdout + r.stderr
    pins = {n: {"ref": ref, "digest": DIGEST, "rocm_version": n[4:]} for n, ref in down.items()}
    images.save_lock(lock, {"images": pins})
    r = _cli(cfg, lock, "lock")
    assert r.returncode == 4 and "registry unreachable" in r.stderr, r.stdout + r.stderr
    assert "nothing to pin" not in r.stdout
    assert images.load_lock(lock)["images"] == images.load_lock(lock)["images"] | pins


@pytest.mark.docker
def test_lock_refuses_an_image_with_another_rocm(docker_client, registry, tmp_path):  # noqa: F811
    # The 7.0 image configured as ROCm 7.2: a pin would run the wrong stack.
    tags = {"rocm7.2": fresh_tag(docker_client, "7.0")}
    lock = tmp_path / "lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", tags, lock=lock)
    r = _cli(cfg, lock, "lock")
    assert r.returncode == 2
    assert "declares rocm_version '7.2' but the image holds ROCm '7.0'" in r.stderr
    pins = images.load_lock(lock)["images"]
    assert "rocm7.2" not in pins


@pytest.mark.docker
def test_pull_by_digest_with_progress(docker_client, registry):  # noqa: F811
    tag = fresh_tag(docker_client, "7.2")
    ref = images.ImageRef.parse(tag).with_digest(images.resolve_digest(docker_client, tag))
    out = io.StringIO()
    image = images.pull(docker_client, ref, out=out)
    assert ref in image.attrs["RepoDigests"]
    assert f"pull {ref}:" in out.getvalue()
    assert images.read_rocm_version(docker_client, ref) == "7.2"


@pytest.mark.docker
def test_pull_errors_say_what_went_wrong(docker_client, registry):  # noqa: F811
    with pytest.raises(ImageError, match="not found"):
        images.pull(docker_client, f"{TEST_REPO}-absent@sha256:{'0' * 64}", out=None)
    with pytest.raises(ImageError, match="not found"):
        images.resolve_digest(docker_client, f"{TEST_REPO}:no-such-tag")
    # Nothing listens on port 9 here: the engine cannot reach that "registry".
    with pytest.raises(ImageError, match="registry unreachable"):
        images.resolve_digest(docker_client, "127.0.0.1:9/cellbench/x:tag")


def test_error_classes_from_engine_messages():
    # The engine's texts for faults we cannot cause here (auth, full disk), as it words them.
    cases = {
        "unauthorized: authentication required": "unauthorised",
        "denied: requested access to the resource is denied": "unauthorised",
        "write /var/lib/docker/tmp/x: no space left on device": "no space left",
        "manifest for x:y not found: manifest unknown": "not found",
        "Get https://r:5000/v2/: dial tcp 10.9.9.9:5000: connection refused": "unreachable",
    }
    for message, expected in cases.items():
        assert expected in str(images.classify_pull_error("x:y", message))


# --- the workflow after a bump -------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(not SNAKEFILE.exists(), reason="the workflow's Snakefile is not there yet")
def test_bump_reruns_exactly_that_images_jobs(docker_client, registry, tmp_path):  # noqa: F811
    tags = {"rocm7.0": fresh_tag(docker_client, "7.0"), "rocm7.2": fresh_tag(docker_client, "7.2")}
    lock = tmp_path / "images.lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", tags, lock=lock)
    assert _cli(cfg, lock, "lock").returncode == 0
    full = _planned(tmp_path, cfg)
    assert any("/rocm7.0/" in out for _, out in full) and any("/rocm7.2/" in o for _, o in full)

    # A finished run: every output present, the stage results whole (an empty stand-in is no
    # result: its reader refuses it and its job is planned again), the gates, report and
    # archives made for real, then `--touch` records each job's metadata (params included:
    # the pinned digest) as if it had run.
    stand_ins(tmp_path, cfg)
    pins = images.load_lock(lock)
    for cell in {c.cell_id for c in cbconfig.cells(cbconfig.load(cfg))}:
        write_cell(
            tmp_path / "results", cell, digest=images.pinned_digest(pins, cell.split("/")[0])
        )
    _snakemake(tmp_path, cfg, "--touch", "--forceall", "--cores", "1")
    targets = ["results/report/test-docker/INDEX.json"]
    targets += [f"results/archive/{label}/ARCHIVED.json" for label in ("rocm7.0", "rocm7.2")]
    _snakemake(
        tmp_path, cfg, "--cores", "1", "--forcerun", "gate", "report", "archive", "--", *targets
    )
    _snakemake(tmp_path, cfg, "--touch", "--cores", "1")
    assert _planned(tmp_path, cfg) == set()

    old = images.pinned_digest(images.load_lock(lock), "rocm7.2")
    new = move_tag(docker_client, tags["rocm7.2"])
    assert _planned(tmp_path, cfg) == set()  # a moved tag is not followed by itself
    assert _cli(cfg, lock, "bump", "rocm7.2").returncode == 0

    after = _planned(tmp_path, cfg)
    expected = {job for job in full if "/rocm7.2/" in job[1]}
    # Beside them: the report, and the gate check that orders itself after it.
    expected |= {job for job in full if job[0] in ("report", "check_gates", "all")}
    assert after == expected
    assert not any("rocm7.0" in out for _, out in after)
    # The jobs run the new pin, by digest.
    plan = _snakemake(tmp_path, cfg, "-n", "-p").splitlines()
    shell = "\n".join(x for x in plan if "reason:" not in x)  # reasons quote the old params
    refs = set(re.findall(r"--image-ref (\S+)", shell))
    assert refs == {images.ImageRef.parse(tags["rocm7.2"]).with_digest(new)}
    assert old != new


def test_options_after_the_subcommand(tmp_path, capsys):
    # `cellbench images status --configfile F` as the README writes it; a missing file is a
    # clear error before any engine or registry is contacted.
    missing = tmp_path / "nope.yaml"
    assert images_command.main(["status", "--configfile", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert images_command.main(["--configfile", str(missing), "lock"]) == 2
    assert str(missing) in capsys.readouterr().err
