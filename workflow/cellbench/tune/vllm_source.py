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
activation and sum are the project's own kernels (cellbench.tune.kernels), unless vLLM's compiled
ops are given too (`load_vllm_ops`: a folder that benchmarks/vllm_ops_pack.py unpacked, named
by CELLBENCH_VLLM_OPS): then each op that loads and passes its correctness check on the GPU
is vLLM's own (`_moe_C` alignment and top-k sum, `_C` SiLU-and-mul and per-token-group fp8
quantisation, called through vLLM's Python wrappers where vLLM has one), and `record()` names,
per part, whose op ran and why.

Nothing of vLLM is copied into this repository: the code runs from the extracted files.
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
    "OPS_ENV",
    "SOURCE_ENV",
    "VllmOps",
    "VllmSourceError",
    "VllmKernelSource",
    "check_source_dir",
    "load_vllm_ops",
    "load_vllm_source",
    "ops_from_env",
    "source_from_env",
]

SOURCE_ENV = "CELLBENCH_VLLM_SOURCE"
OPS_ENV = "CELLBENCH_VLLM_OPS"

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
        self._log = logging.getLogger("cellbench.tune.vllm_source")
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
    from cellbench.tune.kernels.align import moe_align_block_size

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


# vLLM's compiled ops: which library holds each part of the call, and the wrappers vLLM calls
# them through (from the wheel's Python files, run as they are).
_OPS_LIBS = {"_moe_C": "_moe_C_stable_libtorch.abi3.so", "_C": "_C_stable_libtorch.abi3.so"}
_OPS_PART_LIB = {
    "moe_align_block_size": "_moe_C",
    "moe_sum": "_moe_C",
    "silu_and_mul": "_C",
    "activation_quant": "_C",
}
_CUSTOM_OPS = "vllm/_custom_ops.py"
_ALIGN_PY = "vllm/model_executor/layers/fused_moe/moe_align_block_size.py"
# fp8 e4m3fn range and the eps vLLM's per_token_group_quant_fp8 passes on CUDA
_FP8_MAX = 448.0
_GROUP_QUANT_EPS = 1e-10


@dataclass
class VllmOps:
    """vLLM's compiled ops that loaded and passed their check (`used`), and why any other part
    stays the project's (`project`: part -> reason)."""

    folder: Path
    source: dict[str, Any]
    used: dict[str, str] = field(default_factory=dict)
    project: dict[str, str] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    align: Any = None  # vLLM's moe_align_block_size (Python wrapper over _moe_C)
    moe_sum: Any = None

    def has(self, part: str) -> bool:
        return part in self.used

    def silu_and_mul(self, c1: Any) -> Any:
        import torch

        pairs, n2 = c1.shape
        out = torch.empty((pairs, n2 // 2), dtype=c1.dtype, device=c1.device)
        torch.ops._C.silu_and_mul(out, c1)
        return out

    def group_quant(self, x: Any, group: int) -> tuple[Any, Any]:
        """vLLM's per_token_group_quant_fp8 on CUDA: row-major float32 scales, no UE8M0."""
        import torch

        xq = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        xs = torch.empty((*x.shape[:-1], x.shape[-1] // group), dtype=torch.float32,
                         device=x.device)  # fmt: skip
        torch.ops._C.per_token_group_fp8_quant(
            x, xq, xs, group, _GROUP_QUANT_EPS, -_FP8_MAX, _FP8_MAX, False, False, False
        )
        return xq, xs

    def topk_sum(self, c3: Any) -> Any:
        import torch

        m, _topk, k = c3.shape
        out = torch.empty((m, k), dtype=c3.dtype, device=c3.device)
        self.moe_sum(c3, out)
        return out


def _check_align(ops: VllmOps, device: Any) -> str | None:
    """vLLM's alignment against the project's on the same routing: the same padded length
    and, per expert, the same pairs (order inside an expert may differ)."""
    import torch

    from cellbench.tune.kernels.align import moe_align_block_size

    g = torch.Generator(device="cpu").manual_seed(5)
    for m, topk, e, bm in ((1, 8, 128, 16), (37, 8, 128, 16), (300, 8, 128, 64)):
        ids = torch.stack([torch.randperm(e, generator=g)[:topk] for _ in range(m)])
        ids = ids.to(torch.int32).to(device)
        s_v, e_v, n_v = ops.align(ids, bm, e)
        s_p, e_p, n_p = moe_align_block_size(ids, bm, e)
        nv, np_ = int(n_v.item()), int(n_p.item())
        if nv != np_:
            return f"M={m} block {bm}: padded length {nv}, the project's {np_}"
        for sv, ev, sp, ep in ((s_v, e_v, s_p, e_p),):
            blocks = nv // bm
            got, want = {}, {}
            for b in range(blocks):
                for tgt, s, ex in ((got, sv, ev), (want, sp, ep)):
                    rows = s[b * bm : (b + 1) * bm].tolist()
                    tgt.setdefault(int(ex[b]), []).extend(r for r in rows if r < m * topk)
            if {k: sorted(v) for k, v in got.items() if v} != {
                k: sorted(v) for k, v in want.items() if v
            }:
                return f"M={m} block {bm}: pairs grouped differently from the project's"
    return None


def _check_sum(ops: VllmOps, device: Any) -> str | None:
    import torch

    x = torch.randn(33, 8, 2048, device=device, dtype=torch.bfloat16)
    got = ops.topk_sum(x).float()
    want = x.float().sum(1)
    err = float((got - want).abs().max() / want.abs().max())
    return None if err < 2e-2 else f"relative error {err:.3g} against a float sum"


def _check_silu(ops: VllmOps, device: Any) -> str | None:
    import torch

    x = torch.randn(40, 2 * 768, device=device, dtype=torch.bfloat16)
    got = ops.silu_and_mul(x).float()
    g, u = x.float()[:, :768], x.float()[:, 768:]
    want = torch.nn.functional.silu(g) * u
    err = float((got - want).abs().max() / want.abs().max())
    return None if err < 2e-2 else f"relative error {err:.3g} against silu(gate) * up"


def _check_quant(ops: VllmOps, device: Any) -> str | None:
    import torch

    x = torch.randn(40, 2048, device=device, dtype=torch.bfloat16) * 3
    q, s = ops.group_quant(x, 128)
    if tuple(s.shape) != (40, 16):
        return f"scales of shape {tuple(s.shape)}, expected (40, 16)"
    want_s = x.float().view(40, 16, 128).abs().amax(-1) / _FP8_MAX
    if not torch.allclose(s, want_s, rtol=1e-3, atol=1e-12):
        return "scales differ from max|group| / 448"
    back = (q.float().view(40, 16, 128) * s[..., None]).view(40, 2048)
    err = float((back - x.float()).abs().max() / x.float().abs().max())
    return None if err < 0.07 else f"dequantised relative error {err:.3g}"


_CHECKS = {
    "moe_align_block_size": _check_align,
    "moe_sum": _check_sum,
    "silu_and_mul": _check_silu,
    "activation_quant": _check_quant,
}


def load_vllm_ops(folder: str | os.PathLike[str], device: Any = "cuda") -> VllmOps:
    """vLLM's compiled MoE ops from `folder` (benchmarks/vllm_ops_pack.py --unpack wrote it),
    each checked on `device` before it is used. A library that does not load, or an op whose
    check fails, leaves its parts to the project's kernels, with the reason recorded; only a
    folder that is not such a folder at all raises VllmSourceError."""
    import torch

    base = Path(folder)
    rec_file = base / "SOURCE.json"
    if not rec_file.is_file():
        raise VllmSourceError(
            f"vLLM ops folder {base} has no SOURCE.json; expected the folder "
            f"benchmarks/vllm_ops_pack.py --unpack writes"
        )
    source = json.loads(rec_file.read_text())
    ops = VllmOps(base.resolve(), source)
    loaded: dict[str, str | None] = {}
    for ns, lib in _OPS_LIBS.items():
        path = base / lib
        if not path.is_file():
            loaded[ns] = f"{lib} is not in {base}"
            continue
        try:
            torch.ops.load_library(str(path))
            loaded[ns] = None
        except Exception as e:  # noqa: BLE001 - recorded: the part falls back to the project's
            loaded[ns] = f"{lib} does not load here ({type(e).__name__}: {str(e)[:200]})"
    if loaded["_moe_C"] is None:
        platform = _Platform()
        cust: dict[str, Any] = {"torch": torch, "current_platform": platform}
        try:
            _exec_from_file(base / _CUSTOM_OPS, ("moe_align_block_size", "moe_sum"), cust)
            import triton

            wrap: dict[str, Any] = {
                "torch": torch, "triton": triton, "Literal": Any, "overload": lambda f: f,
                "ops": type("ops", (), {"moe_align_block_size":
                                        staticmethod(cust["moe_align_block_size"])}),
                "round_up": lambda x, y: ((x + y - 1) // y) * y,
            }  # fmt: skip
            _exec_from_file(base / _ALIGN_PY, ("moe_align_block_size",), wrap)
            ops.align, ops.moe_sum = wrap["moe_align_block_size"], cust["moe_sum"]
        except (VllmSourceError, OSError, NameError) as e:
            loaded["_moe_C"] = f"vLLM's Python wrappers do not load ({e})"
    for part, ns in _OPS_PART_LIB.items():
        why = loaded[ns]
        if why is None:
            try:
                why = _CHECKS[part](ops, device)
            except Exception as e:  # noqa: BLE001 - an op that raises is not used
                why = f"raised {type(e).__name__}: {str(e)[:200]}"
            ops.checks[part] = "passed" if why is None else f"failed: {why}"
        if why is None:
            ops.used[part] = f"vLLM {source.get('version', '?')} {ns} (compiled, {_OPS_LIBS[ns]})"
        else:
            ops.project[part] = why
    return ops


def ops_from_env() -> str | None:
    """The ops folder named by CELLBENCH_VLLM_OPS, or None (unset or empty)."""
    v = os.environ.get(OPS_ENV, "").strip()
    return v or None


@dataclass
class VllmKernelSource:
    """vLLM's kernel and launcher, loaded from `root`; `record()` says what ran."""

    root: Path
    version: str
    wheel: str | None
    namespace: dict[str, Any] = field(repr=False)
    ops: VllmOps | None = None
    ops_error: str | None = None  # why CELLBENCH_VLLM_OPS's folder was not used at all

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

        from cellbench.tune.kernels.fused_moe import _quantise_rows

        p, q = problem, problem.quant
        m, topk = p.topk_ids.shape
        block = list(q.block_shape) if q is not None and q.block_shape else None
        if q is None:
            a1, a1_scale = p.hidden_states, None
        elif block and self._vllm("activation_quant"):
            a1, a1_scale = self.ops.group_quant(p.hidden_states, block[1])
        else:
            a1, a1_scale = _quantise_rows(p.hidden_states, q)
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

    def _vllm(self, part: str) -> bool:
        return self.ops is not None and self.ops.has(part)

    def activation(self, problem: Any, prep: dict[str, Any]) -> None:
        """SiLU-and-mul of GEMM 1's output, then fp8 per group when quantised: vLLM's ops
        (two launches, as vLLM's fused_experts makes them) where they passed their check,
        else the project's (one launch that also quantises)."""
        from cellbench.tune.kernels.fused_moe import _quantise_rows, _silu_mul

        c1 = prep["c1"].view(-1, prep["c1"].shape[-1])
        q = problem.quant
        block = list(q.block_shape) if q is not None and q.block_shape else None
        if not self._vllm("silu_and_mul"):
            prep["c2"], prep["c2_scale"] = _silu_mul(c1, problem.hidden_states.dtype, q)
            return
        c2 = self.ops.silu_and_mul(c1)
        if q is None:
            prep["c2"], prep["c2_scale"] = c2, None
        elif block and self._vllm("activation_quant"):
            prep["c2"], prep["c2_scale"] = self.ops.group_quant(c2, block[1])
        else:
            prep["c2"], prep["c2_scale"] = _quantise_rows(c2, q)

    def fused_experts(self, problem: Any, config: dict[str, Any]) -> Any:
        """The whole fused-MoE call, vLLM's order of work: quantise, assign, GEMM 1, SiLU-and-
        mul, GEMM 2, top-k sum. Returns (M, K) in the activation dtype."""
        from cellbench.tune.kernels.fused_moe import _sum_topk

        prep = self.prepare(problem, config)
        self.gemm(problem, prep, config, second=False)
        self.activation(problem, prep)
        c3 = self.gemm(problem, prep, config, second=True)
        if self._vllm("moe_sum"):
            return self.ops.topk_sum(c3)
        m, topk, k = c3.shape
        return _sum_topk(c3.view(m * topk, k), m, topk, problem.hidden_states.dtype)

    def parts(self) -> dict[str, str]:
        """Whose op runs each part of the call around vLLM's GEMMs, and why when the
        project's: the per-column note of every side-by-side table."""
        out = {}
        for part in PROJECT_PARTS:
            if self._vllm(part):
                out[part] = self.ops.used[part]
            elif self.ops is not None:
                out[part] = f"project's ({self.ops.project.get(part, 'not loaded')})"
            else:
                out[part] = f"project's ({self.ops_error or f'no {OPS_ENV} folder given'})"
        return out

    def record(self) -> dict[str, Any]:
        """What the tuning summary says about the kernel that was timed."""
        used = [p for p in PROJECT_PARTS if self._vllm(p)]
        rec = {
            "source": f"wheel vllm-{self.version}" + (f" ({self.wheel})" if self.wheel else ""),
            "source_dir": str(self.root),
            "vllm_version": self.version,
            "vllm_parts": list(_FROM_FUSED_MOE) + list(_FROM_UTILS) + used,
            "project_parts": [p for p in PROJECT_PARTS if p not in used],
            "parts": self.parts(),
        }
        if self.ops is not None:
            rec["ops_dir"] = str(self.ops.folder)
            rec["ops_checks"] = dict(self.ops.checks)
            rec["ops_source"] = self.ops.source
        return rec


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
    root: str | os.PathLike[str] | None,
    capability: tuple[int, int] | None = None,
    ops: str | os.PathLike[str] | None = None,
) -> VllmKernelSource:
    """Load vLLM's fused-MoE kernel and launcher from a folder of vLLM's Python sources.

    `root` holds vllm/model_executor/layers/fused_moe/{fused_moe,utils}.py (what
    workflow/scripts/vllm-kernel-src.sh extracts). `capability` stands in for the GPU's
    compute capability (tests under the interpreter); None asks torch. `ops` (default
    CELLBENCH_VLLM_OPS) is a folder of vLLM's compiled ops (`load_vllm_ops`), used on a GPU.
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
    src = VllmKernelSource(base.resolve(), _version(base), wheel, namespace)
    ops = ops if ops is not None else ops_from_env()
    if ops is not None:
        if not torch.cuda.is_available():
            src.ops_error = f"vLLM's compiled ops need a CUDA GPU ({ops} not loaded)"
        else:
            try:
                src.ops = load_vllm_ops(ops, torch.device("cuda", torch.cuda.current_device()))
            except VllmSourceError as e:
                src.ops_error = str(e)
        if src.ops is not None and src.ops.has("moe_align_block_size"):
            namespace["moe_align_block_size"] = src.ops.align  # vLLM's, for its own rule
    return src


def source_from_env() -> str | None:
    """The source folder named by CELLBENCH_VLLM_SOURCE, or None (unset or empty)."""
    v = os.environ.get(SOURCE_ENV, "").strip()
    return v or None
