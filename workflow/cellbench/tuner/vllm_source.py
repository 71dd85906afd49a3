"""vLLM's fused-MoE Triton kernel, loaded from vLLM's Python sources without installing vLLM.

In-container module: stdlib + torch + triton.

What a tuning config changes lives in vLLM's Triton GEMM kernel (`fused_moe_kernel`) and its
launcher (`invoke_fused_moe_triton_kernel`), both Python in
vllm/model_executor/layers/fused_moe/fused_moe.py. The rest of vLLM's fused call (alignment,
SiLU-and-mul, the top-k sum, activation quantisation) are compiled ops that a config does not
change. So a folder holding that file (and the utils.py beside it), extracted from a vLLM
wheel by workflow/scripts/vllm-kernel-src.sh, is enough to time vLLM's own kernel on a GPU
that has no vLLM: the named function definitions are taken from the file with `ast` and
executed, compiled under the file's own path and line numbers (so Triton reads their source
from the file itself), in a namespace that holds triton, tl and torch plus small stand-ins for
the vLLM helpers they call (platform queries, a logger, the Triton allocator). The alignment,
activation and sum are the project's own kernels (cellbench.kernels).

Nothing of vLLM is copied into this repository: the code runs from the extracted file.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SOURCE_ENV",
    "VllmSourceError",
    "VllmKernelSource",
    "check_source_dir",
    "load_vllm_source",
    "source_from_env",
]

SOURCE_ENV = "CELLBENCH_VLLM_SOURCE"

_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
_UTILS = "vllm/model_executor/layers/fused_moe/utils.py"
# vLLM functions run from the sources: the GEMM kernel (and the zero-writer it calls), the
# launcher that turns a config into a launch, the small-batch expert assignment rule, and the
# operand-swap rule the launcher asks.
_FROM_FUSED_MOE = (
    "write_zeros_to_output",
    "fused_moe_kernel",
    "invoke_fused_moe_triton_kernel",
    "_prepare_expert_assignment",
)
_FROM_UTILS = ("enable_swap_ab",)
# What the rest of the call is, when vLLM's compiled ops are absent.
PROJECT_PARTS = ("moe_align_block_size", "silu_and_mul", "activation_quant", "moe_sum")


class VllmSourceError(RuntimeError):
    """The folder does not hold vLLM sources this loader can use (says what is wrong)."""


class _Platform:
    """Stand-in for vllm.platforms.current_platform: the queries the launcher makes, answered
    from torch for the GPU in use. `capability` overrides the device's (tests under the CPU
    interpreter use it to take the Hopper branches)."""

    def __init__(self, capability: tuple[int, int] | None = None):
        self._capability = capability

    def _cap(self) -> tuple[int, int] | None:
        if self._capability is not None:
            return self._capability
        import torch

        if torch.cuda.is_available() and not getattr(torch.version, "hip", None):
            return tuple(torch.cuda.get_device_capability())
        return None

    def is_cuda(self) -> bool:
        return self._cap() is not None

    def is_rocm(self) -> bool:
        import torch

        return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()

    def is_xpu(self) -> bool:
        return False

    def is_device_capability(self, cap: int) -> bool:
        c = self._cap()
        return c is not None and c[0] * 10 + c[1] == cap

    def is_device_capability_family(self, cap: int) -> bool:
        c = self._cap()
        return c is not None and c[0] == cap // 10

    def has_device_capability(self, cap: int) -> bool:
        c = self._cap()
        return c is not None and c[0] * 10 + c[1] >= cap


class _Logger:
    """vLLM's logger API as far as the launcher uses it (warning_once)."""

    def __init__(self) -> None:
        self._log = logging.getLogger("cellbench.tuner.vllm_source")
        self._seen: set[str] = set()

    def warning_once(self, msg: str, *args: Any) -> None:
        if msg not in self._seen:
            self._seen.add(msg)
            self._log.warning(msg, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def _set_triton_allocator(device: Any) -> None:
    """Scratch memory for in-kernel tensor descriptors, from torch (what vLLM registers)."""
    import torch
    import triton

    def alloc(size: int, alignment: int, stream: Any) -> Any:
        return torch.empty(size, device=device, dtype=torch.int8)

    triton.set_allocator(alloc)


def _project_align(topk_ids, block_m, num_experts, expert_map=None, **_ignored):
    """vLLM's moe_align_block_size call, served by the project's alignment kernels (no expert
    map: the tuner times one rank's experts, all local)."""
    from ..kernels.align import moe_align_block_size

    if expert_map is not None:
        raise VllmSourceError("expert_map is not supported by the project's alignment")
    return moe_align_block_size(topk_ids, block_m, num_experts)


def _functions(path: Path, names: tuple[str, ...]) -> list[ast.stmt]:
    """The top-level definitions `names` of a source file, in file order (decorators kept)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError) as e:
        raise VllmSourceError(f"{path}: cannot be read as Python ({e})") from e
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise VllmSourceError(
            f"{path}: has no top-level function {', '.join(missing)}; expected vLLM's "
            f"fused-MoE sources (a vLLM 0.34-style layout: run "
            f"workflow/scripts/vllm-kernel-src.sh)"
        )
    return [n for n in tree.body if n in found.values()]


def _exec_from_file(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> None:
    """Run the definitions of `names` from the file into `namespace`, compiled under the
    file's path with its line numbers: Triton's jit reads a kernel's text back from there."""
    module = ast.Module(body=_functions(path, names), type_ignores=[])
    code = compile(module, str(path), "exec")
    exec(code, namespace)  # noqa: S102 - vLLM's own definitions, from the file named above


def _version(root: Path) -> str:
    rec = root / "SOURCE.json"
    if rec.is_file():
        try:
            return str(json.loads(rec.read_text())["version"])
        except (ValueError, KeyError):
            pass
    vf = root / "vllm" / "_version.py"
    if vf.is_file():
        ns: dict[str, Any] = {}
        try:
            exec(compile(vf.read_text(), str(vf), "exec"), ns)  # noqa: S102 - a version file
            return str(ns.get("__version__") or ns.get("version"))
        except Exception:  # noqa: BLE001 - the version is for the record only
            pass
    return "unknown"


@dataclass
class VllmKernelSource:
    """vLLM's kernel and launcher, loaded from `root`; `record()` says what ran."""

    root: Path
    version: str
    wheel: str | None
    namespace: dict[str, Any] = field(repr=False)

    @property
    def invoke(self):
        return self.namespace["invoke_fused_moe_triton_kernel"]

    @property
    def prepare_assignment(self):
        return self.namespace["_prepare_expert_assignment"]

    def prepare(self, problem: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The GEMMs' inputs, as vLLM's fused_experts makes them: activation quantisation (the
        project's per-token-group / per-tensor fp8 kernels), vLLM's expert assignment (its
        few-token rule, else the project's alignment) and the intermediate buffers."""
        import torch

        from ..kernels.fused_moe import _quantise_rows

        p, q = problem, problem.quant
        m, topk = p.topk_ids.shape
        block = list(q.block_shape) if q is not None and q.block_shape else None
        a1, a1_scale = (p.hidden_states, None) if q is None else _quantise_rows(p.hidden_states, q)
        sorted_ids, expert_ids, post_padded = self.prepare_assignment(
            p.topk_ids, config, m, topk, p.w1.shape[0], None,
            block_shape=block, ignore_invalid_experts=True,
        )  # fmt: skip
        dt = p.hidden_states.dtype
        return {
            "a1": a1,
            "a1_scale": a1_scale,
            "assign": (sorted_ids, expert_ids, post_padded),
            "c1": torch.empty((m, topk, p.w1.shape[1]), dtype=dt, device=p.device),
            "c3": torch.empty((m, topk, p.w2.shape[1]), dtype=dt, device=p.device),
        }

    def gemm(self, problem: Any, prep: dict[str, Any], config: dict[str, Any], second: bool):
        """One of vLLM's two grouped GEMMs through vLLM's launcher (GEMM 2 applies the routing
        weights, as fused_experts asks by default)."""
        import triton.language as tl

        p, q = problem, problem.quant
        ct = {"torch.bfloat16": tl.bfloat16, "torch.float16": tl.float16}.get(
            str(p.hidden_states.dtype), tl.float32
        )
        block = list(q.block_shape) if q is not None and q.block_shape else None
        if second:
            a, a_scale, w = prep["c2"], prep["c2_scale"], p.w2
            w_scale, c, topk, mul = (q.w2_scale if q else None), prep["c3"], 1, True
        else:
            a, a_scale, w = prep["a1"], prep["a1_scale"], p.w1
            w_scale, c, topk, mul = (q.w1_scale if q else None), prep["c1"], p.shape.topk, False
        self.invoke(
            a, w, c, a_scale, w_scale, p.topk_weights, *prep["assign"], mul, topk, dict(config),
            compute_type=ct, use_fp8_w8a8=q is not None, use_int8_w8a8=False,
            use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
            block_shape=block,
        )  # fmt: skip
        return c

    def activation(self, problem: Any, prep: dict[str, Any]) -> None:
        """SiLU-and-mul of GEMM 1's output (fp8 per group when quantised): the project's."""
        from ..kernels.fused_moe import _silu_mul

        c1 = prep["c1"]
        prep["c2"], prep["c2_scale"] = _silu_mul(
            c1.view(-1, c1.shape[-1]), problem.hidden_states.dtype, problem.quant
        )

    def fused_experts(self, problem: Any, config: dict[str, Any]) -> Any:
        """The whole fused-MoE call, vLLM's order of work: quantise, assign, GEMM 1, SiLU-and-
        mul, GEMM 2, top-k sum. Returns (M, K) in the activation dtype."""
        from ..kernels.fused_moe import _sum_topk

        prep = self.prepare(problem, config)
        self.gemm(problem, prep, config, second=False)
        self.activation(problem, prep)
        c3 = self.gemm(problem, prep, config, second=True)
        m, topk, k = c3.shape
        return _sum_topk(c3.view(m * topk, k), m, topk, problem.hidden_states.dtype)

    def record(self) -> dict[str, Any]:
        """What the tuning summary says about the kernel that was timed."""
        return {
            "source": f"wheel vllm-{self.version}" + (f" ({self.wheel})" if self.wheel else ""),
            "source_dir": str(self.root),
            "vllm_version": self.version,
            "vllm_parts": list(_FROM_FUSED_MOE) + list(_FROM_UTILS),
            "project_parts": list(PROJECT_PARTS),
        }


def check_source_dir(root: str | os.PathLike[str]) -> str | None:
    """What is wrong with a vLLM source folder (missing, lacking a file), or None."""
    base = Path(root)
    if not base.is_dir():
        return (
            f"vLLM source folder {base} does not exist; create it with "
            f"workflow/scripts/vllm-kernel-src.sh {base}"
        )
    for rel in (_FUSED_MOE, _UTILS):
        if not (base / rel).is_file():
            return (
                f"vLLM source folder {base} lacks {rel}; expected the files "
                f"workflow/scripts/vllm-kernel-src.sh extracts from a vLLM wheel"
            )
    return None


def load_vllm_source(
    root: str | os.PathLike[str] | None, capability: tuple[int, int] | None = None
) -> VllmKernelSource:
    """Load vLLM's fused-MoE kernel and launcher from a folder of vLLM's Python sources.

    `root` holds vllm/model_executor/layers/fused_moe/{fused_moe,utils}.py (what
    workflow/scripts/vllm-kernel-src.sh extracts). `capability` stands in for the GPU's
    compute capability (tests under the interpreter); None asks torch.
    """
    import torch
    import triton
    import triton.language as tl

    if root is None:
        raise VllmSourceError(f"no vLLM source folder given (set {SOURCE_ENV})")
    bad = check_source_dir(root)
    if bad is not None:
        raise VllmSourceError(bad)
    base = Path(root)
    kernel_file, utils_file = base / _FUSED_MOE, base / _UTILS
    platform = _Platform(capability)
    namespace: dict[str, Any] = {
        "__name__": "cellbench_vllm_fused_moe",
        "Any": Any,
        "functools": functools,
        "torch": torch,
        "triton": triton,
        "tl": tl,
        "current_platform": platform,
        "logger": _Logger(),
        # vLLM's tensor-descriptor gather path: on CUDA it is chosen only by VLLM_TRITON_USE_TD
        # (unset: off), and off for quantised weights; the stand-ins keep it off.
        "resolve_moe_use_td": lambda: False,
        "warn_if_moe_use_td_ineffective": lambda *a, **k: None,
        "set_triton_allocator": _set_triton_allocator,
        "moe_align_block_size": _project_align,
    }
    utils_ns: dict[str, Any] = {"functools": functools, "current_platform": platform}
    _exec_from_file(utils_file, _FROM_UTILS, utils_ns)
    for name in _FROM_UTILS:
        namespace[name] = utils_ns[name]
    try:
        _exec_from_file(kernel_file, _FROM_FUSED_MOE, namespace)
    except VllmSourceError:
        raise
    except Exception as e:  # noqa: BLE001 - a name the stand-ins lack, a newer Triton API
        raise VllmSourceError(
            f"{kernel_file}: its kernel definitions do not load here "
            f"({type(e).__name__}: {e}); Triton {triton.__version__}"
        ) from e
    wheel = None
    rec = base / "SOURCE.json"
    if rec.is_file():
        try:
            wheel = json.loads(rec.read_text()).get("wheel")
        except ValueError:
            wheel = None
    return VllmKernelSource(base.resolve(), _version(base), wheel, namespace)


def source_from_env() -> str | None:
    """The source folder named by CELLBENCH_VLLM_SOURCE, or None (unset or empty)."""
    v = os.environ.get(SOURCE_ENV, "").strip()
    return v or None
