"""Config validation: every bad config fails with one message naming the key and the value."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cellbench.config import loader as cbconfig
from cellbench.config import strict_yaml

ROOT = Path(__file__).resolve().parents[2]


def production() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def local() -> dict:
    return yaml.safe_load((ROOT / "config/local.yaml").read_text())


def test_shipped_configs_are_valid_and_expand_to_cells():
    prod = cbconfig.validate(production())
    assert [c.cell_id for c in cbconfig.cells(prod)] == [
        "rocm7.0/qwen3-30b-a3b-fp8/tp2-ep2",
        "rocm7.0/qwen3.5-35b-a3b-fp8/tp2-ep2",
        "rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2",
        "rocm7.2/qwen3.5-35b-a3b-fp8/tp2-ep2",
    ]
    # The seeds' grid, GSM8K 5-shot, vLLM's default batch sizes.
    assert [(p["isl"], p["osl"]) for p in prod["serve"]["grid"]] == [
        (512, 512),
        (1024, 1024),
        (2048, 2048),
        (4096, 4096),
        (8192, 1024),
        (16384, 2048),
    ]
    assert prod["gsm8k"]["num_fewshot"] == 5
    assert cbconfig.batch_sizes(prod)[0] == 1 and cbconfig.batch_sizes(prod)[-1] == 4096
    assert len(cbconfig.batch_sizes(prod)) == 18
    assert cbconfig.archive_label(prod, "rocm7.2") == "rocm7.2"
    loc = cbconfig.validate(local())
    assert loc["runtime"] == "local"
    assert cbconfig.archive_label(loc, "host-cpu") == "embedded-cpu"


def test_defaults_are_filled():
    cfg = production()
    del cfg["serve"]["repeats"]
    cbconfig.validate(cfg)
    assert cfg["serve"]["repeats"] == 3
    assert cfg["tune"]["max_configs"] == 0


def _set(cfg: dict, path: str, value):
    node = cfg
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node[k]
    last = keys[-1]
    if value is _DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


_DELETE = object()

BAD = [
    # (base, key path, value, words the message must contain)
    ("prod", "colour", "blue", ["unknown key", "'colour'"]),
    ("prod", "serve.warmup", 3, ["unknown key", "'warmup'", "serve"]),
    ("prod", "cells.0.images", ["rocm9.9"], ["cells[0].images", "'rocm9.9'", "not defined"]),
    ("prod", "cells.0.models", ["llama"], ["cells[0].models", "'llama'", "not defined"]),
    ("prod", "cells.0.tp", 3, ["cells[0].tp", "3", "power of two"]),
    ("prod", "cells.0.tp", 16, ["cells[0].tp", "16", "exceeds", "8 GPUs"]),
    ("prod", "cells.0.tp", 0, ["cells[0].tp", "0", "minimum"]),
    ("local", "cells.0.ep", True, ["cells[0].ep", "tp = 1", "expert parallel"]),
    ("prod", "serve.grid.0.isl", -512, ["serve.grid[0].isl", "-512", "minimum"]),
    ("prod", "serve.grid.2.osl", 0, ["serve.grid[2].osl", "0"]),
    ("prod", "runtime", "podman", ["runtime", "podman"]),
    ("prod", "images.rocm7.0.ref", "rocm/vllm-dev", ["images.rocm7.0.ref", "rocm/vllm-dev"]),
    ("prod", "images.rocm7.0.rocm_version", _DELETE, ["images.rocm7.0", "rocm_version"]),
    ("prod", "tune.batch_sizes", [], ["tune.batch_sizes", "[]"]),
    ("prod", "tune.batch_sizes", [1, -4], ["tune.batch_sizes", "-4"]),
    ("prod", "tune.mode", "fast", ["tune.mode", "fast"]),
    ("prod", "models.qwen3-30b-a3b-fp8.dtype", "int3", ["models.qwen3-30b-a3b-fp8.dtype", "int3"]),
    ("prod", "serve.max_failed_share", 1.5, ["serve.max_failed_share", "1.5"]),
    ("prod", "models", {}, ["models", "{}"]),
]


@pytest.mark.parametrize("base,path,value,words", BAD, ids=[f"{b[1]}={b[2]!r}" for b in BAD])
def test_bad_config_is_named(base, path, value, words):
    cfg = copy.deepcopy(production() if base == "prod" else local())
    # image names contain dots: address them as one key
    if path.startswith("images.rocm7.0."):
        node = cfg["images"]["rocm7.0"]
        key = path.removeprefix("images.rocm7.0.")
        if value is _DELETE:
            del node[key]
        else:
            node[key] = value
    elif path.startswith("models.qwen3-30b-a3b-fp8."):
        cfg["models"]["qwen3-30b-a3b-fp8"][path.rsplit(".", 1)[1]] = value
    else:
        _set(cfg, path, value)
    with pytest.raises(cbconfig.ConfigError) as err:
        cbconfig.validate(cfg)
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(cbconfig.ConfigError, match="does not exist"):
        cbconfig.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime: [local\n")
    with pytest.raises(cbconfig.ConfigError, match="not valid YAML"):
        cbconfig.load(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(cbconfig.ConfigError, match="empty"):
        cbconfig.load(empty)


def test_snakemake_dry_run_reports_the_bad_key(tmp_path):
    cfg = production()
    cfg["serve"]["grid"][1]["isl"] = -1024
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "all", "--configfile", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "serve.grid[1].isl = -1024" in proc.stdout + proc.stderr


def test_cells_cli_lists_targets():
    proc = subprocess.run(
        [sys.executable, "-m", "cellbench.cli", "cells", "--configfile", "config/config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "4 cells" in proc.stdout
    assert "results/rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2/serve/tuned/bench.json" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "cellbench.cli", "cells", "--configfile", "missing.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_strict_yaml_allows_merge_keys_and_refuses_repeats(tmp_path):
    """An anchor merged with `<<:` and then overridden is not a duplicate; a repeated key is,
    at any depth, with both lines named. The shipped configs read strictly."""
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {isl: 32, osl: 16}\npoint:\n  <<: *b\n  osl: 8\n")
    assert strict_yaml.read_yaml(merged)["point"] == {"isl": 32, "osl": 8}
    nested = tmp_path / "nested.yaml"
    nested.write_text("serve:\n  grid:\n    - {isl: 1, isl: 2, osl: 3}\n")
    with pytest.raises(cbconfig.ConfigError) as err:
        strict_yaml.read_yaml(nested)
    expected = f"config file '{nested}', line 3: duplicate key 'isl' (first at line 3)"
    assert expected in str(err.value)
    strict_yaml.check_files(sorted((ROOT / "config").glob("*.yaml")))


def test_cli_version_and_shared_default_config(capsys, monkeypatch):
    from cellbench import cli
    from cellbench.config import images_command

    monkeypatch.chdir(ROOT)
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "cellbench 0.1.0"
    # `cellbench cells` and `cellbench images` read the same file by default (the profile's)
    profile = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert cli.DEFAULT_CONFIGFILE == profile["configfile"] == "config/local.yaml"
    assert images_command.main(["status"]) == 2
    assert "config/local.yaml has runtime: local" in capsys.readouterr().err
