"""benchmarks/gpu_label.py: the GPU's short name that benchmark output files carry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_label.py"
spec = importlib.util.spec_from_file_location("gpu_label", SCRIPT)
gpu_label = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_label)


@pytest.mark.parametrize(
    ("device", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_device_names_shorten_to_the_model(device, label):
    assert gpu_label.short_name(device) == label


def test_a_given_name_wins_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setattr(gpu_label, "detected", lambda: "h200")
    assert gpu_label.gpu_label("h100") == "h100"
    assert gpu_label.gpu_label(None) == "h200"
    with pytest.raises(SystemExit, match="--gpu 'H 100'"):
        gpu_label.gpu_label("H 100")
