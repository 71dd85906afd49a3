"""Fused-MoE problem shapes from a Hugging Face config, named the way vLLM names them.

In-container module: standard library only (torch is imported lazily by `device_name`).

vLLM looks up its tuned Triton configs by a file name built from the per-rank shape:
``E={E},N={N},device_name={dev}[,dtype={dtype}][,block_shape=[{n},{k}]].json``.
Without expert parallelism N is the MoE intermediate size divided by TP; with expert
parallelism (EP size = TP here) the experts are split across ranks and N is not sharded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MoEShape",
    "ShapeError",
    "SUPPORTED_DTYPES",
    "VLLM_CONFIG_KEYS",
    "ROCM_CONFIG_KEYS",
    "read_model_config",
    "moe_shape",
    "device_name",
    "main",
]

# dtype strings vLLM puts in config file names (None = bf16/fp16 activations and weights).
SUPPORTED_DTYPES = ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16", "float32")
# Keys of one batch size's entry in vLLM's fused-MoE config files (the first four pick the
# tiling; all six are written), and the ROCm-only Triton options vLLM also reads there.
VLLM_CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
ROCM_CONFIG_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
# Spellings that mean "unquantised" (no dtype suffix in the file name).
_PLAIN_DTYPES = {"none", "bf16", "bfloat16", "fp16", "float16", "half"}

# vLLM's fixed ROCm names by PCI device id (the marketing names vary between drivers).
ROCM_DEVICE_NAMES = {
    0x7551: "AMD_Radeon_R9700",
    0x74A1: "AMD_Instinct_MI300X",
    0x74A5: "AMD_Instinct_MI325X",
}

CPU_DEVICE_NAME = "CPU_TRITON_INTERPRET"

# Field names, most specific first. Each entry: (field, family it comes from).
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
_INTER_FIELDS = ("moe_intermediate_size", "intermediate_size")
_TOPK_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k")


class ShapeError(ValueError):
    """A model config or option that does not give a valid fused-MoE shape."""


@dataclass(frozen=True)
class MoEShape:
    """Per-rank fused-MoE shape, as vLLM's kernel sees it.

    num_experts: E, experts held by one rank.
    intermediate_size: N, per-rank MoE intermediate size (w1 is (E, 2N, K), w2 is (E, K, N)).
    hidden_size: K, the model's hidden size.
    topk: experts per token.
    dtype: None for bf16/fp16, else a vLLM dtype string such as "fp8_w8a8".
    block_shape: (block_n, block_k) for block quantisation, else None.
    """

    num_experts: int
    intermediate_size: int
    hidden_size: int
    topk: int
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None

    def config_file_name(self, device_name: str) -> str:
        """vLLM's tuned-config file name for this shape on `device_name`."""
        name = f"E={self.num_experts},N={self.intermediate_size},device_name={device_name}"
        if self.dtype:
            name += f",dtype={self.dtype}"
        if self.block_shape:
            name += f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]"
        return name + ".json"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (block_shape as a list or None)."""
        d = asdict(self)
        d["block_shape"] = list(self.block_shape) if self.block_shape else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoEShape:
        """Inverse of `to_dict`."""
        bs = d.get("block_shape")
        return cls(
            num_experts=int(d["num_experts"]),
            intermediate_size=int(d["intermediate_size"]),
            hidden_size=int(d["hidden_size"]),
            topk=int(d["topk"]),
            dtype=d.get("dtype"),
            block_shape=(int(bs[0]), int(bs[1])) if bs else None,
        )


def read_model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Hugging Face config.json (or a directory holding one) into a dict.

    A Hugging Face model id (``org/name``) that is not a local path is fetched through
    huggingface_hub's cache, as vLLM itself does inside its image (HF_TOKEN from the environment).
    """
    p = Path(path)
    if not p.exists() and _looks_like_hub_id(str(path)):
        p = _hub_config(str(path))
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ShapeError(f"model config not found: {p}")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ShapeError(f"model config {p} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ShapeError(f"model config {p} must hold a JSON object, got {type(cfg).__name__}")
    return cfg


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _hub_config(repo_id: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download  # in every vLLM image; not on a bare host
    except ImportError as e:
        raise ShapeError(
            f"model config {repo_id!r} is neither a local path nor resolvable: "
            "huggingface_hub is not installed"
        ) from e
    try:
        # The cache folder is read from the environment now, not when huggingface_hub was imported.
        cache = os.environ.get("HF_HUB_CACHE")
        return Path(hf_hub_download(repo_id, "config.json", cache_dir=cache))
    except Exception as e:  # network, auth or missing repo: one clear message
        raise ShapeError(
            f"could not fetch config.json of {repo_id!r} from the Hugging Face "
            f"hub: {type(e).__name__}: {e}"
        ) from e


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of the config that describes the language model (multimodal models nest it)."""
    tc = cfg.get("text_config")
    if isinstance(tc, dict) and any(f in tc for f in _EXPERT_FIELDS):
        return tc
    return cfg


def _first_int(cfg: dict[str, Any], fields: tuple[str, ...], what: str) -> tuple[str, int]:
    for f in fields:
        if cfg.get(f) is not None:
            v = cfg[f]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ShapeError(f"model config field {f}={v!r} must be a positive integer")
            return f, v
    raise ShapeError(
        f"model config has no {what} field (looked for {', '.join(fields)}); "
        "is this a mixture-of-experts model?"
    )


def _quant_config(cfg: dict[str, Any]) -> dict[str, Any]:
    for c in (cfg, cfg.get("text_config") or {}):
        q = c.get("quantization_config") if isinstance(c, dict) else None
        if isinstance(q, dict):
            return q
    return {}


def _normalise_dtype(dtype: str | None, qcfg: dict[str, Any]) -> str | None:
    if dtype == "auto":
        method = qcfg.get("quant_method")
        if method is None:
            return None
        if method == "fp8":
            return "fp8_w8a8"
        raise ShapeError(
            f"quantization_config.quant_method={method!r} has no fused-MoE Triton dtype here "
            "(supported: 'fp8'); pass dtype explicitly"
        )
    if dtype is None or dtype.lower() in _PLAIN_DTYPES:
        return None
    if dtype not in SUPPORTED_DTYPES:
        raise ShapeError(
            f"dtype={dtype!r} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}, "
            "'auto' or None (bf16/fp16)"
        )
    return dtype


def _parse_block_shape(block_shape: Any) -> tuple[int, int] | None:
    if block_shape is None:
        return None
    if isinstance(block_shape, str):
        parts = block_shape.replace("[", "").replace("]", "").split(",")
        try:
            block_shape = [int(x) for x in parts]
        except ValueError as e:
            raise ShapeError(f"block_shape={block_shape!r} must be two integers 'n,k'") from e
    try:
        bn, bk = block_shape
    except (TypeError, ValueError) as e:
        raise ShapeError(f"block_shape={block_shape!r} must have exactly two entries") from e
    for v in (bn, bk):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ShapeError(f"block_shape={block_shape!r} must hold positive integers")
    return (bn, bk)


def moe_shape(
    cfg: dict[str, Any],
    tp: int = 1,
    ep: bool = False,
    dtype: str | None = "auto",
    block_shape: Any = "auto",
) -> MoEShape:
    """Per-rank fused-MoE shape for a model config at tensor parallel size `tp`.

    ep: expert parallel on (EP size = tp): experts are split across ranks, N unsharded.
    dtype: "auto" reads quantization_config (quant_method "fp8" -> "fp8_w8a8"); None means
        bf16/fp16; otherwise a vLLM dtype string.
    block_shape: "auto" reads quantization_config.weight_block_size when the dtype is
        quantised; None for none; or (n, k) / "n,k".
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ShapeError(f"tp={tp!r} must be a positive integer")
    tc = _text_config(cfg)
    ef, n_experts = _first_int(tc, _EXPERT_FIELDS, "expert-count")
    inter_f, inter = _first_int(tc, _INTER_FIELDS, "MoE intermediate size")
    _, hidden = _first_int(tc, ("hidden_size",), "hidden_size")
    _, topk = _first_int(tc, _TOPK_FIELDS, "experts-per-token")
    if topk > n_experts:
        raise ShapeError(f"experts per token ({topk}) exceeds {ef}={n_experts}")

    if ep:
        if n_experts % tp:
            raise ShapeError(
                f"{ef}={n_experts} is not divisible by the expert-parallel size {tp} (= tp)"
            )
        e_rank, n_rank = n_experts // tp, inter
    else:
        if inter % tp:
            raise ShapeError(f"{inter_f}={inter} is not divisible by tp={tp}")
        e_rank, n_rank = n_experts, inter // tp

    qcfg = _quant_config(cfg)
    dt = _normalise_dtype(dtype, qcfg)
    if isinstance(block_shape, str) and block_shape == "auto":
        wbs = qcfg.get("weight_block_size")
        bs = _parse_block_shape(wbs) if (dt is not None and wbs is not None) else None
    else:
        bs = _parse_block_shape(block_shape)
        if bs is not None and dt is None:
            raise ShapeError(f"block_shape={list(bs)} needs a quantised dtype (e.g. fp8_w8a8)")
    if bs is not None:
        bn, bk = bs
        # Block scales must tile the per-rank weights exactly: w1 is (2N, K), w2 is (K, N).
        if n_rank % bn:
            raise ShapeError(f"block_shape n={bn} does not divide per-rank N={n_rank}")
        if hidden % bk:
            raise ShapeError(f"block_shape k={bk} does not divide hidden_size K={hidden}")
        if n_rank % bk:
            raise ShapeError(
                f"block_shape k={bk} does not divide per-rank N={n_rank} (w2's reduction dim)"
            )
    return MoEShape(e_rank, n_rank, hidden, topk, dt, bs)


def _sanitise(name: str) -> str:
    return re.sub(r"\s+", "_", name.strip()).replace("/", "_")


def _rocm_device_id() -> int | None:
    """PCI device id of the AMD GPUs in sysfs, if they all agree (None otherwise)."""
    ids = set()
    for dev in Path("/sys/class/drm").glob("renderD*/device"):
        try:
            if (dev / "vendor").read_text().strip().lower() != "0x1002":
                continue
            ids.add(int((dev / "device").read_text().strip(), 16))
        except (OSError, ValueError):
            continue
    return ids.pop() if len(ids) == 1 else None


def device_name() -> str:
    """vLLM's device name for GPU 0, or CPU_TRITON_INTERPRET when there is no GPU."""
    import torch  # lazy: keeps `shapes` importable with the stdlib alone

    if not torch.cuda.is_available():
        return CPU_DEVICE_NAME
    if getattr(torch.version, "hip", None):
        try:  # vLLM knows its own mapping best when it is installed
            from vllm.platforms import current_platform  # type: ignore[import-not-found]

            return _sanitise(current_platform.get_device_name())
        except Exception:  # noqa: BLE001 - vLLM absent or unusable: fall back to sysfs
            pass
        dev_id = _rocm_device_id()
        if dev_id in ROCM_DEVICE_NAMES:
            return ROCM_DEVICE_NAMES[dev_id]
    return _sanitise(torch.cuda.get_device_name(0))


# The same words as the config's refusal of `ep: true` with `tp: 1` (config.py uses this too).
EP_NEEDS_TP = "expert parallel needs more than one rank"
# A device name becomes part of a file name (``...,device_name=NAME,...json``): no folder
# separators, no commas or '=' (the name's own separators), nothing a shell would mangle.
DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DEVICE_NAME_RULE = "letters, digits, '_', '.', '-', starting with a letter or digit"


def check_shape_arguments(args: argparse.Namespace) -> None:
    """Refuse what the config refuses, before any model config is read; ShapeError."""
    check_tp_ep(args.tp, args.ep)
    if args.device_name is not None and not DEVICE_NAME_RE.match(args.device_name):
        raise ShapeError(
            f"--device-name {args.device_name!r}: it becomes part of a file name, so it may "
            f"hold only {DEVICE_NAME_RULE}"
        )


def check_tp_ep(tp: int, ep: bool) -> None:
    """The hand command lines' refusals of a layout the config schema and loader refuse."""
    if tp < 1:
        raise ShapeError(f"--tp={tp} must be >= 1")
    if ep and tp == 1:
        raise ShapeError(f"--ep with --tp 1: {EP_NEEDS_TP} (give --tp 2 or more, or drop --ep)")


def add_shape_arguments(
    p: argparse.ArgumentParser, *, dtype_help: str, defaults: bool = True
) -> None:
    """Options naming a fused-MoE shape, shared by `cellbench shapes` and `cellbench tune`.
    Without ``defaults`` (the tuner's, whose job may give these) nothing is required or
    filled in: the parser's own default applies."""

    def d(value):
        return {"default": value} if defaults else {}

    p.add_argument(
        "--model-config",
        required=defaults,
        help="config.json, a model directory, or a Hugging Face model id",
    )
    p.add_argument("--tp", type=int, **d(1), help="tensor parallel size (default 1)")
    p.add_argument("--ep", action="store_true", **d(False), help="expert parallel (EP size = TP)")
    p.add_argument("--dtype", **d("auto"), help=dtype_help)
    p.add_argument(
        "--block-shape", **d("auto"), help="'n,k' (e.g. 128,128), 'none', or 'auto' (default)"
    )
    p.add_argument("--device-name", help="device name in the file name (default: this machine)")


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cellbench shapes",
        description="Print the per-rank fused-MoE shape and vLLM's tuned-config file name.",
    )
    add_shape_arguments(
        p, dtype_help="fp8_w8a8, int8_w8a16, ..., 'none' for bf16/fp16, 'auto' from the config"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI `cellbench shapes --model-config PATH --tp N [--ep] ...`; returns 2 on bad input."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad options, 0 on --help
        return int(e.code or 0)
    block = None if args.block_shape.lower() == "none" else args.block_shape
    try:
        check_shape_arguments(args)
        cfg = read_model_config(args.model_config)
        shape = moe_shape(cfg, args.tp, args.ep, dtype=args.dtype, block_shape=block)
    except ShapeError as e:
        if args.model_config not in str(e):  # say which model config the fault is in
            e = ShapeError(f"{args.model_config}: {e}")
        print(f"cellbench shapes: error: {e}", file=sys.stderr)
        return 2
    dev = args.device_name or device_name()
    fname = shape.config_file_name(dev)
    if args.json:
        print(json.dumps({**shape.to_dict(), "device_name": dev, "config_file": fname}))
    else:
        print(
            f"E={shape.num_experts} N={shape.intermediate_size} K={shape.hidden_size} "
            f"topk={shape.topk} dtype={shape.dtype or 'bf16/fp16'} "
            f"block_shape={list(shape.block_shape) if shape.block_shape else None}"
        )
        print(fname)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def path_choices_file_name(config_file_name: str) -> str:
    """The builtin kernel's path-choices file beside a vLLM config file: the same name with
    `.paths.json` for `.json` (vLLM opens only its exact file name, so it never reads this)."""
    if not config_file_name.endswith(".json"):
        raise ValueError(f"{config_file_name!r}: a vLLM config file name ends in .json")
    return config_file_name[: -len(".json")] + ".paths.json"
