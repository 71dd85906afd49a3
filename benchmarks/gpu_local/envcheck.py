"""Environment check before the GPU run spends minutes: versions, the GPU, and every import the
workflow's host side needs, so a missing or broken package fails in seconds with its name.

    python benchmarks/gpu_local/envcheck.py      # exit 0: ready; 3: an import failed

Also lists requirement conflicts among the installed distributions (as ``pip check`` would),
as warnings: the image's own packages may be older or newer than the wheels expect.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import platform
import sys
import traceback

# What the workflow imports on the host, beyond the standard library: Snakemake and its
# plugins' interfaces, the project's package, the server (transformers serve with its serving
# extras, and the two hooks cellbench.serve.tf_serve relies on), lm-eval's OpenAI-compatible client
# and the datasets loader its local task uses.
IMPORTS = [
    "snakemake",
    "snakemake.cli",
    "jsonschema",
    "yaml",
    "requests",
    "aiohttp",
    "filelock",
    "pandas",
    "scipy",
    "tabulate",
    "matplotlib",
    "pyarrow",
    "prometheus_client.parser",
    "pynvml",
    "torch",
    "triton",
    "transformers",
    "transformers.cli.serving.model_manager",
    "transformers.integrations.moe",
    "fastapi",
    "uvicorn",
    "openai",
    "pydantic",
    "datasets",
    "lm_eval",
    "lm_eval.models.openai_completions",
    "cellbench",
    "cellbench.config",
    "cellbench.serve.stage",
    "cellbench.tune",
    "cellbench.serve.experts_tf",
    "cellbench.serve.tf_serve",
]

VERSIONS = [
    "torch",
    "triton",
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "safetensors",
    "snakemake",
    "lm-eval",
    "datasets",
    "pyarrow",
    "matplotlib",
    "prometheus-client",
    "nvidia-ml-py",
    "fsspec",
    "numpy",
    "pandas",
    "fastapi",
    "uvicorn",
    "pydantic",
    "openai",
]


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"


def conflicts() -> list[str]:
    """Requirements of installed distributions that the installed versions do not meet."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    have: dict[str, str] = {}
    for d in md.distributions():  # sys.path order: the first of a name is the one imported
        have.setdefault(canonicalize_name(d.metadata["Name"] or ""), d.version)
    out = []
    seen = set()
    for d in md.distributions():
        name = canonicalize_name(d.metadata["Name"] or "")
        if name in seen:
            continue
        seen.add(name)
        for spec in d.requires or []:
            req = Requirement(spec)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            got = have.get(canonicalize_name(req.name))
            if got is None:
                out.append(f"{name} {d.version} needs {req}: not installed")
            elif req.specifier and not req.specifier.contains(got, prereleases=True):
                out.append(f"{name} {d.version} needs {req}: {got} installed")
    return out


def main() -> int:
    print(f"python {platform.python_version()} at {sys.executable}")
    print("versions: " + ", ".join(f"{n} {_version(n)}" for n in VERSIONS))
    failed = []
    for mod in IMPORTS:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any failure here means the run would fail
            failed.append(mod)
            print(f"IMPORT FAILED: {mod}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
        else:
            print("GPU: none visible to torch (the run would use the CPU)")
        from cellbench.tune.shapes import device_name

        print(f"vLLM device name: {device_name()}")
    except Exception as e:  # noqa: BLE001
        print(f"GPU check failed: {type(e).__name__}: {e}")
    found = conflicts()
    for line in found:
        print(f"requirement warning: {line}")
    print(f"{len(found)} requirement warnings; {len(failed)} failed imports")
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
