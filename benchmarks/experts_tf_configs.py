"""Does the tuned config change the speed of the tiny model served with the project's kernel?

Generates ``--new`` tokens (greedy) from a ``--prompt``-token prompt with the embedded
default's tiny Qwen3-MoE loaded with ``experts_implementation="cellbench_triton"``
(``cellbench.serve.experts_tf``), once per tuned folder holding one config file of vLLM's name for
the
model's MoE shape, every batch size mapped to one launch config (A: 16/16/16, B: 64/64/64
BLOCK_SIZE_M/N/K), and with no folder at all (vLLM's default rule). The variants alternate
repeat by repeat (A B D, then D B A, ...) so drift of a shared machine falls on all of them;
eager (transformers' own experts, no Triton) is timed alongside for scale. Under
``TRITON_INTERPRET=1`` (no GPU) the interpreter's time follows the number of programs each
config launches, which is the effect measured here; on a GPU the same script times compiled
kernels.

    .venv/bin/python benchmarks/experts_tf_configs.py [--model DIR] [--repeats 3] [--out FILE]

Without ``--model`` it builds the tiny model into a temporary folder
(``python -m cellbench.assets model --kind tiny-qwen3-moe``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from cellbench.serve import experts_tf  # sets TRITON_INTERPRET (no GPU) before triton loads
from cellbench.tune.kernels import config_lookup as cl

CONFIGS = {
    "A_16x16x16": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1},
    "B_64x64x64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1},
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _build_model(folder: Path) -> Path:
    out = folder / "tiny"
    cmd = [sys.executable, "-m", "cellbench.assets", "model", "--kind", "tiny-qwen3-moe"]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True)
    return out


def _write_folder(root: Path, label: str, config: dict, name: str) -> Path:
    folder = root / label
    folder.mkdir(parents=True, exist_ok=True)
    table = {str(m): config for m in BATCH_SIZES}
    (folder / name).write_text(json.dumps(table, indent=1) + "\n")
    return folder


def _time_generate(model, ids: torch.Tensor, new: int) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new
    return dt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="tiny model folder (default: build one)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new", type=int, default=16, help="generated tokens")
    p.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default="float32",
        help="load the model in this dtype (float32: as saved; float16: as the embedded "
        "default tunes it, and the file name then has no dtype part)",
    )
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    a = p.parse_args(argv)

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as tf_logging

    tf_logging.set_verbosity_error()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = a.model or _build_model(root)
        name = experts_tf.register()
        dt = getattr(torch, a.dtype)
        ours = AutoModelForCausalLM.from_pretrained(
            model_dir, experts_implementation=name, dtype=dt
        )
        eager = AutoModelForCausalLM.from_pretrained(
            model_dir, experts_implementation="eager", dtype=dt
        )
        ours.eval()
        eager.eval()
        exp = ours.model.layers[0].mlp.experts
        file_name = cl.config_file_name(
            exp.gate_up_proj.shape[0], exp.down_proj.shape[2], experts_tf._dtype_part(ours.dtype)
        )
        folders = {k: _write_folder(root, k, v, file_name) for k, v in CONFIGS.items()}
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(10, ours.config.vocab_size, (1, a.prompt), generator=g)

        def run(variant: str) -> float:
            if variant == "eager":
                return _time_generate(eager, ids, a.new)
            cl.clear_cache()  # a fresh server process would read the folder afresh
            if variant == "default":
                os.environ.pop(cl.ENV_FOLDER, None)
            else:
                os.environ[cl.ENV_FOLDER] = str(folders[variant])
            return _time_generate(ours, ids, a.new)

        variants = [*CONFIGS, "default", "eager"]
        run(variants[0])  # warm-up: first-call costs (imports, interpreter set-up)
        times: dict[str, list[float]] = {v: [] for v in variants}
        order = []
        for r in range(a.repeats):
            seq = variants if r % 2 == 0 else variants[::-1]
            order.append(list(seq))
            for v in seq:
                times[v].append(run(v))

    med = {v: statistics.median(ts) for v, ts in times.items()}
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "interpreter": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "config_file": file_name,
        "configs": CONFIGS,
        "dtype": a.dtype,
        "prompt_tokens": a.prompt,
        "new_tokens": a.new,
        "order": order,
        "seconds": times,
        "median_s": med,
        "ratio_A_over_B": med["A_16x16x16"] / med["B_64x64x64"],
    }
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"generate {a.new} tokens from a {a.prompt}-token prompt, tiny Qwen3-MoE {a.dtype}")
    print(f"config file: {file_name}")
    print(f"{'variant':<14} {'median s':>9}  runs")
    for v in variants:
        print(f"{v:<14} {med[v]:>9.3f}  " + " ".join(f"{t:.3f}" for t in times[v]))
    print(f"A / B = {result['ratio_A_over_B']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
