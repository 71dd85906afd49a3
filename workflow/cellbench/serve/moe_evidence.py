"""Which fused-MoE launch config a server used, read from what the server logged.

vLLM (0.32-0.34, ``get_moe_configs``) logs once per process either

    Using configuration from <path> for MoE layer.
    Using default MoE config. Performance might be sub-optimal! Config file not found at <p>, <p>

and neither when the MoE layer does not run the Triton kernel (AITER's MoE on ROCm, a CPU
backend). The project's own experts implementation for ``transformers serve`` logs the same two
lines. ``read_evidence`` turns a server log into one observation per arm:

* ``tuned``     a file under the arm's tuned-config folder was loaded;
* ``shipped``   a file elsewhere (the image's own vLLM configs) was loaded;
* ``default``   no file was found: vLLM's default heuristic ran;
* ``none seen`` no fused-MoE Triton path logged anything;
* ``mixed``     processes of one server disagree (e.g. TP ranks that found different files).

``arm_problem`` says what is wrong with an arm's evidence (None when it is what the arm needs).

``read_parallelism`` reads, from the same log, the parallel layout and device the server says
it ran with (vLLM's engine-config line, its workers' ``world_size=`` lines, its parsed
arguments and its expert-parallel line); a server that logs none of them gives nulls.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

LOADED_RE = re.compile(r"Using configuration from (?P<path>.+?) for MoE layer\.")
DEFAULT_RE = re.compile(
    r"Using default MoE config\. Performance might be sub-optimal! "
    r"Config file not found at (?P<paths>.+?)\s*$"
)
# vLLM 0.32 (v1/engine/core.py) logs its whole engine config once, from the engine process:
#   Initializing a V1 LLM engine (v0.32.0) with config: model='...', ...,
#   tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, ...,
#   device_config=cpu, ...
ENGINE_RE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: ")
# Each worker (distributed/parallel_state.py): "world_size=2 rank=1 local_rank=1 ...".
WORKER_RE = re.compile(r"\bworld_size=(?P<world>\d+) rank=(?P<rank>\d+) ")
# The API server's parsed command line (entrypoints/serve/utils/api_utils.py), a dict repr.
ARGS_RE = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
# Once per process with expert parallelism on (fused_moe/expert_map_manager.py).
EP_RE = re.compile(r"\[EP Rank (?P<rank>\d+)/(?P<size>\d+)\] Expert parallelism is enabled")
SOURCES = ("tuned", "shipped", "default", "none seen", "mixed")
# Environment variables that decide whether vLLM's Triton fused-MoE path runs at all.
MOE_ENV = ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE", "VLLM_TUNED_CONFIG_FOLDER")


def _under(path: str, folders: Iterable[str]) -> bool:
    path = path.rstrip("/")
    return any(path.startswith(folder.rstrip("/") + "/") for folder in folders if folder)


def _paths(text: str) -> list[str]:
    """The searched paths of a default-config line. Older vLLM joins them with ", ", newer
    prints a Python list; config file names hold commas of their own (no space after)."""
    text = text.strip()
    if text.startswith("["):
        try:
            return [str(p) for p in ast.literal_eval(text)]
        except (ValueError, SyntaxError):
            text = text.strip("[]")
    return [p.strip(" '\"") for p in text.split(", ") if p.strip(" '\"")]


def read_evidence(log_text: str, tuned_folders: Iterable[str] = ()) -> dict[str, Any]:
    """The MoE config source a server's log shows. ``tuned_folders`` are the paths the server
    saw its tuned folder as (the host path, and the path inside a container)."""
    tuned_folders = [str(f) for f in tuned_folders]
    lines, kinds, paths, searched = [], set(), [], []
    for raw in log_text.splitlines():
        line = raw.strip()
        if m := LOADED_RE.search(line):
            path = m.group("path").strip()
            kinds.add("tuned" if _under(path, tuned_folders) else "shipped")
            paths.append(path)
            lines.append(line)
        elif m := DEFAULT_RE.search(line):
            kinds.add("default")
            searched += _paths(m.group("paths"))
            lines.append(line)
    if not kinds:
        source = "none seen"
    elif len(kinds) == 1:
        source = kinds.pop()
    else:
        source = "mixed"
    return {
        "source": source,
        "paths": sorted(set(paths)),
        "searched": sorted(set(searched)),
        # One line per process is enough to show; a TP=8 server logs eight alike.
        "log_lines": sorted(set(lines))[:8],
    }


def arm_problem(
    arm: str,
    evidence: dict[str, Any],
    env: dict[str, str] | None = None,
    *,
    triton_moe_possible: bool = True,
) -> str | None:
    """Why an arm's evidence makes its numbers untrustworthy, with the fix; None when fine.
    A tuned arm must have loaded its tuned file; an untuned arm must not have (a shipped file
    is allowed, and labelled). ``triton_moe_possible=False`` (a server with no GPU, e.g.
    vLLM's CPU build) accepts ``none seen`` on both arms: no Triton kernel exists there to
    read a config, so the arms cannot differ, and the report says so."""
    source = evidence["source"]
    said = "; ".join(evidence["log_lines"]) or "no fused-MoE config line at all"
    env = env or {}
    if source == "none seen" and not triton_moe_possible:
        return None
    if arm == "tuned" and source != "tuned":
        if source == "none seen":
            aiter = {k: env[k] for k in MOE_ENV[:2] if k in env}
            hint = (
                f"the server's environment has {aiter}: set VLLM_ROCM_USE_AITER=0 for this "
                "model so the Triton fused-MoE kernel (which reads the tuned file) runs"
                if aiter.get("VLLM_ROCM_USE_AITER", "0") not in ("0", "false", "False")
                else "the server's MoE layers do not run the Triton fused-MoE kernel (AITER or "
                "a CPU backend), so no tuned config can apply"
            )
        elif source == "default":
            hint = (
                "the tuned file's name does not match what the server looked for "
                f"({', '.join(evidence['searched'])}): check E, N, device_name, dtype and "
                "block_shape of the tuned file against these"
            )
        else:
            hint = f"it loaded {', '.join(evidence['paths'])} instead of the tuned file"
        return (
            f"tuned arm: expected the server to load the tuned config file, but its log says "
            f"{source!r} ({said}); {hint}"
        )
    if arm == "untuned" and source in ("tuned", "mixed"):
        return (
            f"untuned arm: expected no tuned config, but its log says {source!r} ({said}); "
            "the untuned server must not see the tuned folder (VLLM_TUNED_CONFIG_FOLDER)"
        )
    if source == "mixed":
        return f"{arm} arm: the server's processes loaded different MoE configs ({said})"
    return None


def arm_label(arm: str, evidence: dict[str, Any]) -> str:
    """How a report names the arm: an untuned arm that loaded the image's own file is the
    'shipped' arm."""
    if arm == "untuned" and evidence.get("source") == "shipped":
        return "shipped"
    return arm


def observe(
    log_text: str,
    tuned_folders: Iterable[str],
    env: dict[str, str],
) -> dict[str, Any]:
    """What bench.json records per arm: the evidence of ``read_evidence`` plus the server's
    MoE-relevant environment as observed where it was set (the container's for docker)."""
    return {**read_evidence(log_text, tuned_folders), "env": dict(env)}


def _engine_value(line: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=([^,\s]+)", line)
    return m.group(1) if m else None


def read_parallelism(log_text: str) -> dict[str, Any]:
    """The parallel layout and device a server's own log states, or nulls where it says nothing.

    ``tp``/``pp``/``dp`` and ``device`` come from vLLM's engine-config line; ``world_size`` is
    the largest its workers logged (else tp x pp when the engine line was seen); ``ep`` is the
    size of the ``[EP Rank r/n]`` line, else, from the engine line and the parsed arguments,
    tp x dp with ``enable_expert_parallel`` and 1 without. ``source`` is ``server log`` when
    the engine line or a worker line was found, else null (e.g. ``transformers serve``, which
    logs no layout). ``log_lines`` are the lines read (cut to 300 characters each)."""
    engine = args = None
    worlds: list[int] = []
    ep_sizes: set[int] = set()
    lines: list[str] = []
    for raw in log_text.splitlines():
        line = raw.strip()
        if engine is None and ENGINE_RE.search(line):
            engine = line
            lines.append(line[:300])
        elif m := WORKER_RE.search(line):
            worlds.append(int(m.group("world")))
            if len(lines) < 8:
                lines.append(line[:300])
        elif args is None and (m := ARGS_RE.search(line)):
            try:
                args = ast.literal_eval(m.group("args"))
            except (ValueError, SyntaxError):
                args = None
            lines.append(line[:300])
        elif m := EP_RE.search(line):
            ep_sizes.add(int(m.group("size")))
    out: dict[str, Any] = {
        "source": None,
        "tp": None,
        "pp": None,
        "dp": None,
        "ep": None,
        "world_size": None,
        "device": None,
        "log_lines": lines,
    }
    if engine is not None:
        for key, name in (
            ("tensor_parallel_size", "tp"),
            ("pipeline_parallel_size", "pp"),
            ("data_parallel_size", "dp"),
        ):
            value = _engine_value(engine, key)
            out[name] = int(value) if value and value.isdigit() else None
        out["device"] = _engine_value(engine, "device_config")
    if worlds:
        out["world_size"] = max(worlds)
    elif out["tp"] is not None and out["pp"] is not None:
        out["world_size"] = out["tp"] * out["pp"]
    if len(ep_sizes) == 1:
        out["ep"] = ep_sizes.pop()
    elif ep_sizes:
        out["ep"] = None  # ranks disagree: not one layout
    elif out["tp"] is not None:
        enabled = isinstance(args, dict) and bool(args.get("enable_expert_parallel"))
        out["ep"] = out["tp"] * (out["dp"] or 1) if enabled else 1
    if engine is not None or worlds:
        out["source"] = "server log"
    return out
