"""Find a fused-MoE launch config the way vLLM's fused-MoE layer does, and say so in its words.

In-container module: standard library (plus ``cellbench.tune.shapes``; torch only through
``shapes.device_name``).

vLLM (0.32-0.34, ``fused_moe.get_moe_configs`` / ``try_get_optimal_moe_config``) resolves the
config of one call of M tokens like this, and so does ``lookup`` here:

1. File name: ``E={E},N={N},device_name={dev}[,dtype=..][,block_shape=[n,k]].json`` (built by
   ``MoEShape.config_file_name``), where N is w2's last dimension, the dtype part is the weight
   quantisation (``fp8_w8a8``, ...) or ``float32`` for unquantised float32 activations (none
   for bf16/fp16), and any device of the H200 family is named ``NVIDIA_H200``.
2. Folders, in order: ``$VLLM_TUNED_CONFIG_FOLDER`` when the variable is set (even empty), then
   vLLM's own ``model_executor/layers/fused_moe/configs/`` when vLLM is installed (found
   without importing it). The first file that exists wins; its ``triton_version`` key is
   ignored; the rest maps batch sizes to configs. A file is read once per process.
3. Entry: the one whose batch-size key is nearest to M; of two equally near, the one listed
   first in the file (vLLM takes ``min`` over the keys in file order).
4. No file: vLLM's default heuristic (``default_config``).

It logs, once per process and message, exactly vLLM's lines

    Using configuration from <path> for MoE layer.
    Using default MoE config. Performance might be sub-optimal! Config file not found at <p>, <p>

through ``logging`` (logger ``cellbench.tune.kernels.config_lookup``) to stderr, so they land in a
server's log where ``cellbench.serve.moe_evidence`` reads them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from cellbench.tune.shapes import MoEShape, device_name, path_choices_file_name

__all__ = [
    "ENV_FOLDER",
    "VLLM_CONFIGS_SUBDIR",
    "Resolved",
    "clear_cache",
    "config_file_name",
    "default_config",
    "lookup",
    "nearest_entry",
    "nearest_key",
    "read_path_choices",
    "read_table",
    "resolve",
    "search_paths",
    "vllm_configs_folder",
    "vllm_device_name",
]

ENV_FOLDER = "VLLM_TUNED_CONFIG_FOLDER"
VLLM_CONFIGS_SUBDIR = ("model_executor", "layers", "fused_moe", "configs")

log = logging.getLogger(__name__)

_lock = threading.Lock()
_resolved: dict[str, Resolved] = {}
_said: set[str] = set()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (so a test's capture,
    or a server's redirected stderr, gets it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401 - property of logging.StreamHandler
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _ensure_handler() -> None:
    """Give the logger its own stderr handler (INFO and up) unless someone configured one:
    a ``transformers serve`` process configures only its own and uvicorn's loggers, so an INFO
    record from here would otherwise be dropped."""
    if log.handlers:
        return
    h = _StderrHandler()
    # vLLM-like prefix: level, time, [file:line]; the message is what the evidence parser reads.
    h.setFormatter(
        logging.Formatter(
            "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"
        )
    )
    log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def _say_once(level: int, message: str) -> None:
    with _lock:
        if message in _said:
            return
        _said.add(message)
    _ensure_handler()
    log.log(level, message)


def clear_cache() -> None:
    """Forget read files and logged lines (tests; vLLM itself never re-reads in a process)."""
    with _lock:
        _resolved.clear()
        _said.clear()


def vllm_device_name(name: str) -> str:
    """The device part of vLLM's file name: every device of the H200 family shares the
    ``NVIDIA_H200`` files (vLLM checks for an ``H200`` word among the name's ``_`` parts)."""
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(
    num_experts: int,
    n: int,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    device: str | None = None,
) -> str:
    """vLLM's config file name for a layer whose w2 is (E, K, N), on ``device`` (default: this
    machine's GPU 0 as ``shapes.device_name`` names it; ``CPU_TRITON_INTERPRET`` without one).
    A block shape with a zero part counts as none, as in vLLM."""
    bs = tuple(int(x) for x in block_shape) if block_shape and all(block_shape) else None
    # K and topk are not part of the name; MoEShape wants them, any positive value does.
    shape = MoEShape(int(num_experts), int(n), 1, 1, dtype or None, bs)  # type: ignore[arg-type]
    return shape.config_file_name(vllm_device_name(device or _this_device()))


@functools.cache
def _this_device() -> str:
    return device_name()


def vllm_configs_folder() -> Path | None:
    """vLLM's own fused-MoE config folder when vLLM is installed (not imported: importing vLLM
    costs seconds and may fail where it is present but unusable); else None."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(os.path.realpath(list(spec.submodule_search_locations)[0]))
    return base.joinpath(*VLLM_CONFIGS_SUBDIR)


def search_paths(name: str) -> list[str]:
    """The paths vLLM would try for file ``name``, in order. ``VLLM_TUNED_CONFIG_FOLDER`` counts
    when set at all: set but empty, vLLM joins it into the bare file name (relative to the
    working directory), and so does this."""
    paths = []
    folder = os.environ.get(ENV_FOLDER)
    if folder is not None:
        paths.append(os.path.join(folder, name))
    shipped = vllm_configs_folder()
    if shipped is not None:
        paths.append(str(shipped / name))
    return paths


def read_table(path: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """A config file as {batch size: config}, in file order, without ``triton_version``."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a fused-MoE config file holds a JSON object")
    table = {}
    for key, entry in raw.items():
        if key == "triton_version":
            continue
        try:
            m = int(key)
        except ValueError:
            raise ValueError(f"{path}: key {key!r} is not a batch size") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: entry {key!r} is not a config object")
        table[m] = entry
    if not table:
        raise ValueError(f"{path}: no batch-size entries")
    return table


def nearest_key(table: dict[int, Any], m: int) -> int:
    """The batch-size key nearest to ``m``; a tie goes to the key met first in ``table``'s
    order (vLLM's ``min`` over the file's keys does the same)."""
    best = None
    for key in table:
        if best is None or abs(key - m) < abs(best - m):
            best = key
    if best is None:
        raise ValueError("empty config table")
    return best


def nearest_entry(table: dict[int, dict[str, Any]], m: int) -> dict[str, Any]:
    """The entry of the key nearest to ``m`` (``nearest_key``)."""
    return table[nearest_key(table, m)]


def default_config(
    m: int,
    num_experts: int,
    n: int,
    k: int,
    topk: int,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    rocm: bool | None = None,
) -> dict[str, int]:
    """vLLM's fallback when no file exists, restated:

    * block-quantised fp8: one 64-row tile per program, the weight block's own n x k tile,
      GROUP_SIZE_M 32, 4 warps, 3 pipeline stages (2 on ROCm, where 3 can run out of
      shared memory);
    * otherwise, as long as there are no more tokens than experts (few rows per expert),
      small 16 x 32 x 64 tiles without grouping; beyond that 64 x 64 x 32 tiles in groups of 8.

    vLLM also sets SPLIT_K=1 (no split: the project's kernel has no such key) and leaves
    num_warps/num_stages to Triton's defaults outside the fp8 block case. Weight-only int4/int8
    (wna16) calls have a different rule that this kernel cannot use: refused.
    """
    # Here vLLM tests the block shape for None only (wna16 passes [0, group]).
    bs = tuple(block_shape) if block_shape is not None else None
    if dtype in ("int4_w4a16", "int8_w8a16") and bs is not None:
        raise ValueError(f"dtype {dtype} with a block shape (wna16) has no default here")
    if dtype == "fp8_w8a8" and bs is not None:
        if rocm is None:
            rocm = _on_rocm()
        return {
            "BLOCK_SIZE_M": 64,
            "BLOCK_SIZE_N": int(bs[0]),
            "BLOCK_SIZE_K": int(bs[1]),
            "GROUP_SIZE_M": 32,
            "num_warps": 4,
            "num_stages": 2 if rocm else 3,
        }
    if m <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def _on_rocm() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and getattr(torch.version, "hip", None))


class Resolved:
    """Where one layer shape's configs come from: a file's table, or vLLM's default rule."""

    def __init__(
        self,
        name: str,
        path: str | None,
        table: dict[int, dict[str, Any]] | None,
        searched,
        path_choices: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.table = table
        self.searched = list(searched)
        # The builtin kernel's measured path choices beside the file (read_path_choices).
        self.path_choices = path_choices

    @property
    def source(self) -> str:
        return "file" if self.table is not None else "default"

    def line(self) -> str:
        """vLLM's log line for this resolution."""
        if self.path is not None:
            return f"Using configuration from {self.path} for MoE layer."
        # With nothing to search (no folder set, no vLLM) the bare name still says what was
        # missing, and keeps the line parseable.
        where = ", ".join(self.searched) or self.name
        return (
            "Using default MoE config. Performance might be sub-optimal! "
            f"Config file not found at {where}"
        )


def resolve(
    num_experts: int,
    n: int,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    device: str | None = None,
) -> Resolved:
    """Find (once per process and file name) the config file for a layer shape, and log
    vLLM's line about it."""
    name = config_file_name(num_experts, n, dtype, block_shape, device)
    with _lock:
        res = _resolved.get(name)
    if res is None:
        searched = search_paths(name)
        found = next((p for p in searched if os.path.exists(p)), None)
        res = Resolved(
            name,
            found,
            read_table(found) if found else None,
            searched,
            read_path_choices(found) if found else None,
        )
        with _lock:
            res = _resolved.setdefault(name, res)
    _say_once(logging.INFO if res.path else logging.WARNING, res.line())
    return res


def read_path_choices(config_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The builtin kernel's measured path choices beside a config file (the tuner's
    `<name>.paths.json`, see ``tuner.artifacts.write_path_choices``), as read from the file,
    for ``kernels.load_path_choices``; None when there is none."""
    path = Path(config_path)
    if path.suffix != ".json":
        return None
    side = path.with_name(path_choices_file_name(path.name))
    if not side.exists():
        return None
    raw = json.loads(Path(side).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{side}: a path-choices file holds a JSON object")
    return raw


def lookup(
    m: int,
    num_experts: int,
    n: int,
    k: int,
    topk: int,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """The launch config vLLM would use for a call of ``m`` tokens on a layer with w1
    (E, 2N, K) and w2 (E, K, N): the nearest entry of the tuned/shipped file, else vLLM's
    default. Returns a fresh dict (callers may edit it)."""
    res = resolve(num_experts, n, dtype, block_shape, device)
    if res.table is not None:
        return dict(nearest_entry(res.table, m))
    return default_config(m, num_experts, n, k, topk, dtype, block_shape)
