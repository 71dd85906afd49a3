"""The GPU's short name in a benchmark's output names (`tuner_vllm_kernel_h100_bf16.json`).

`--gpu NAME` wins; without it the name comes from the device the run sees
(`torch.cuda.get_device_name`: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200,
"AMD Instinct MI300X" -> mi300x), and a run without a GPU (the CPU interpreter's smoke runs) is
`cpu`. The committed result folders keep the names they were written with.

    python3 benchmarks/gpu_label.py          # prints the label this machine gets
"""

from __future__ import annotations

import argparse
import re

# Words of a device name that say who made it, not which GPU it is.
MAKER_WORDS = {"nvidia", "amd", "instinct", "tesla", "geforce", "radeon", "rtx"}
LABEL = re.compile(r"[a-z0-9][a-z0-9.-]*")


def short_name(device_name: str) -> str:
    """The first word of ``device_name`` that holds a digit, after the maker's words."""
    words = [w for w in re.split(r"[\s_-]+", device_name) if w and w.lower() not in MAKER_WORDS]
    for word in words:
        if re.search(r"\d", word):
            return re.sub(r"[^a-z0-9]", "", word.lower())
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "gpu"


def detected() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    return short_name(torch.cuda.get_device_name(0))


def gpu_label(given: str | None) -> str:
    """``given`` (checked: lower case, digits, dots, dashes), else the detected device's name."""
    if given is None or given == "":
        return detected()
    if not LABEL.fullmatch(given):
        raise SystemExit(f"--gpu {given!r}: use lower-case letters, digits, '.' and '-' (h100)")
    return given


def add_gpu_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--gpu",
        default=None,
        help="GPU name in the output file names (default: this device's, e.g. h100, h200; "
        "cpu without a GPU)",
    )


if __name__ == "__main__":
    print(gpu_label(None))
