"""Fused-MoE config lookup as vLLM does it (cellbench.tune.kernels.config_lookup), on the config
files vLLM 0.34 ships (the shared reference copy when present, else tests/data's), and the
lines it logs, read back by cellbench.serve.moe_evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cellbench.serve import moe_evidence
from cellbench.tune.kernels import config_lookup as cl

SHARED = Path("/work/shared/reference/vllm-configs")
REF = SHARED if SHARED.is_dir() else Path(__file__).resolve().parents[1] / "data" / "vllm-configs"
REF_FILES = sorted(REF.glob("*.json"))
NAME_RE = re.compile(
    r"E=(?P<e>\d+),N=(?P<n>\d+),device_name=(?P<dev>[^,]+)"
    r"(?:,dtype=(?P<dtype>[^,]+?))?(?:,block_shape=\[(?P<bn>\d+),(?P<bk>\d+)\])?\.json$"
)
TINY_NAME = "E=8,N=32,device_name=CPU_TRITON_INTERPRET.json"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test starts like a fresh process: nothing read, nothing logged, no folder set."""
    monkeypatch.delenv(cl.ENV_FOLDER, raising=False)
    cl.clear_cache()
    yield
    cl.clear_cache()


def _parts(path: Path):
    m = NAME_RE.match(path.name)
    assert m, path.name
    bs = (int(m["bn"]), int(m["bk"])) if m["bn"] else None
    return int(m["e"]), int(m["n"]), m["dtype"], bs, m["dev"]


def _vllm_nearest(path: Path, m: int) -> dict:
    """vLLM's rule restated independently: int keys in file order, `min` by distance to M."""
    raw = json.loads(path.read_text())
    raw.pop("triton_version", None)
    table = {int(k): v for k, v in raw.items()}
    return table[min(table.keys(), key=lambda x: abs(x - m))]


def test_reference_files_are_there():
    assert len(REF_FILES) >= 6
    assert any("triton_version" in json.loads(p.read_text()) for p in REF_FILES)


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: p.name)
def test_file_names_equal_the_shipped_ones(path):
    e, n, dtype, bs, dev = _parts(path)
    assert cl.config_file_name(e, n, dtype, bs, device=dev) == path.name
    # A zero part in the block shape means none, as in vLLM.
    if bs is None:
        assert cl.config_file_name(e, n, dtype, (0, 0), device=dev) == path.name


def test_h200_family_shares_the_h200_files():
    assert cl.vllm_device_name("NVIDIA_H200_NVL") == "NVIDIA_H200"
    assert cl.vllm_device_name("NVIDIA_H200") == "NVIDIA_H200"
    assert cl.vllm_device_name("NVIDIA_H100_80GB_HBM3") == "NVIDIA_H100_80GB_HBM3"
    name = cl.config_file_name(128, 768, device="NVIDIA_H200_NVL")
    assert name == "E=128,N=768,device_name=NVIDIA_H200.json" and (REF / name).exists()


def test_this_machine_and_float32_names():
    assert cl.config_file_name(8, 32, None, None, device="CPU_TRITON_INTERPRET") == TINY_NAME
    assert cl.config_file_name(8, 32, "float32", device="CPU_TRITON_INTERPRET") == (
        "E=8,N=32,device_name=CPU_TRITON_INTERPRET,dtype=float32.json"
    )


@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: p.name)
def test_nearest_key_agrees_with_vllm_for_every_m(path, monkeypatch, capsys):
    e, n, dtype, bs, dev = _parts(path)
    monkeypatch.setenv(cl.ENV_FOLDER, str(REF))
    for m in [*range(0, 300), 383, 384, 385, 767, 768, 769, 1279, 1280, 1281, 2560, 3583, 5000]:
        got = cl.lookup(m, e, n, 2048, 8, dtype, bs, device=dev)
        assert got == _vllm_nearest(path, m), m
    assert "triton_version" not in cl.resolve(e, n, dtype, bs, device=dev).table
    err = capsys.readouterr().err
    assert err.count("Using configuration from") == 1  # once per process, not per call


def test_ties_go_to_the_key_met_first():
    table = {16: {"x": 16}, 24: {"x": 24}, 1: {"x": 1}}
    assert cl.nearest_entry(table, 20) == {"x": 16}
    assert cl.nearest_entry({24: {"x": 24}, 16: {"x": 16}}, 20) == {"x": 24}
    assert cl.nearest_entry(table, 0) == {"x": 1}
    assert cl.nearest_entry(table, 10_000) == {"x": 24}


def test_default_rule():
    small = cl.default_config(8, 8, 32, 64, 2)
    assert small == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    large = cl.default_config(9, 8, 32, 64, 2)
    assert large == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    fp8 = cl.default_config(4096, 128, 768, 2048, 8, "fp8_w8a8", (128, 128), rocm=False)
    assert fp8 == {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 128,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 32,
        "num_warps": 4,
        "num_stages": 3,
    }
    assert (
        cl.default_config(1, 128, 768, 2048, 8, "fp8_w8a8", (128, 128), rocm=True)["num_stages"]
        == 2
    )
    # fp8 without a block shape follows the plain rule.
    assert cl.default_config(1, 128, 768, 2048, 8, "fp8_w8a8") == cl.default_config(
        1, 128, 768, 2048, 8
    )
    with pytest.raises(ValueError, match="wna16"):
        cl.default_config(1, 8, 32, 64, 2, "int4_w4a16", (0, 128))


def _fake_vllm(root: Path, files: dict[str, dict]) -> Path:
    """A stand-in vLLM package (found by importlib.util.find_spec, never imported) with
    config files in its fused-MoE folder."""
    pkg = root / "vllm"
    folder = pkg.joinpath(*cl.VLLM_CONFIGS_SUBDIR)
    folder.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('this stand-in must not be imported')\n")
    for name, body in files.items():
        (folder / name).write_text(json.dumps(body))
    return folder


ENTRY_A = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1}
ENTRY_B = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


def test_tuned_folder_before_vllms_own_and_the_evidence_reads_each(tmp_path, monkeypatch, capsys):
    shipped = _fake_vllm(tmp_path / "site", {TINY_NAME: {"1": ENTRY_A}})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert cl.vllm_configs_folder() == shipped.resolve()
    tuned = tmp_path / "tuned"
    tuned.mkdir()
    dev = "CPU_TRITON_INTERPRET"

    # Only vLLM's own file: the server used a shipped config.
    monkeypatch.setenv(cl.ENV_FOLDER, str(tuned))
    assert cl.lookup(1, 8, 32, 64, 2, device=dev) == ENTRY_A
    ev = moe_evidence.read_evidence(capsys.readouterr().err, [str(tuned)])
    assert ev["source"] == "shipped" and ev["paths"] == [str(shipped.resolve() / TINY_NAME)]

    # A tuned file of the same name wins.
    cl.clear_cache()
    (tuned / TINY_NAME).write_text(json.dumps({"triton_version": "3.6.0", "1": ENTRY_B}))
    assert cl.lookup(1, 8, 32, 64, 2, device=dev) == ENTRY_B
    err = capsys.readouterr().err
    assert f"Using configuration from {tuned / TINY_NAME} for MoE layer." in err
    ev = moe_evidence.read_evidence(err, [str(tuned)])
    assert ev["source"] == "tuned" and ev["paths"] == [str(tuned / TINY_NAME)]
    assert moe_evidence.arm_problem("tuned", ev) is None

    # Neither: vLLM's default, and the line names both places, tuned folder first.
    cl.clear_cache()
    (tuned / TINY_NAME).unlink()
    (shipped / TINY_NAME).unlink()
    assert cl.lookup(1, 8, 32, 64, 2, device=dev) == cl.default_config(1, 8, 32, 64, 2)
    err = capsys.readouterr().err
    want = [str(tuned / TINY_NAME), str(shipped.resolve() / TINY_NAME)]
    assert "Config file not found at " + ", ".join(want) in err
    ev = moe_evidence.read_evidence(err, [str(tuned)])
    assert ev["source"] == "default" and ev["searched"] == sorted(want)
    assert "does not match" in moe_evidence.arm_problem("tuned", ev)


def test_no_folder_and_no_vllm_still_gives_a_readable_default_line(monkeypatch, capsys):
    monkeypatch.setattr(cl, "vllm_configs_folder", lambda: None)
    cfg = cl.lookup(4, 8, 32, 64, 2, device="CPU_TRITON_INTERPRET")
    assert cfg == cl.default_config(4, 8, 32, 64, 2)
    assert cl.lookup(5, 8, 32, 64, 2, device="CPU_TRITON_INTERPRET") == cfg
    err = capsys.readouterr().err
    assert err.count("Using default MoE config.") == 1
    ev = moe_evidence.read_evidence(err, [])
    assert ev["source"] == "default" and ev["searched"] == [TINY_NAME]


def test_set_but_empty_folder_is_joined_like_vllm(monkeypatch):
    monkeypatch.setenv(cl.ENV_FOLDER, "")
    monkeypatch.setattr(cl, "vllm_configs_folder", lambda: None)
    assert cl.search_paths(TINY_NAME) == [TINY_NAME]


def test_bad_files_are_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"triton_version": "3.6.0"}))
    with pytest.raises(ValueError, match="no batch-size entries"):
        cl.read_table(p)
    p.write_text(json.dumps({"small": ENTRY_A}))
    with pytest.raises(ValueError, match="not a batch size"):
        cl.read_table(p)
