"""The tuner's outputs: vLLM's config JSON, an AITER-style CSV, the tuning log, the summary.

In-container module: standard library only.

Every whole-file write goes to a temporary file in the same folder and is renamed into place,
so a killed run never leaves a file that looks complete. The log is the exception: it is
appended one line (one `write` call) per candidate and flushed, which is what lets a killed
run resume; a torn last line is ignored when it is read back.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.tune.shapes import ROCM_CONFIG_KEYS, VLLM_CONFIG_KEYS, path_choices_file_name

__all__ = [
    "atomic_write_text",
    "atomic_write_json",
    "TuningLog",
    "vllm_config_json",
    "write_vllm_config",
    "path_choices_file_name",
    "write_path_choices",
    "AITER_COLUMNS",
    "write_tuned_csv",
    "VLLM_KEYS",
    "ROCM_KEYS",
]

VLLM_KEYS = VLLM_CONFIG_KEYS
ROCM_KEYS = ROCM_CONFIG_KEYS

AITER_COLUMNS = (
    "cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,"
    "use_g1u1,doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,"
    "run_1stage,tflops,bw,_tag"
).split(",")


# One atomic-write implementation for the whole package (stdlib only, so usable in the image).
atomic_write_text = atomicio.write_text
atomic_write_json = atomicio.write_json


class TuningLog:
    """Append-only JSON-lines log of every candidate (timed, pruned or failed).

    Each record has at least: m, key (canonical config text), config, status
    ('timed' | 'pruned' | 'failed'), stage. Timed records carry time_us and samples_us.
    Several processes (one per GPU) may append to the same file: each record is one
    O_APPEND write, which Linux does not interleave for regular files.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._records: list[dict[str, Any]] = self.read(self.path)
        self._timed: dict[tuple[int, str, str], dict[str, Any]] = {}
        self._seen: set[tuple[int, str, str, str]] = set()
        for r in self._records:
            self._index(r)
        self.resumed = len(self._records)

    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """All complete records of a log (a torn or corrupt line is skipped)."""
        p = Path(path)
        if not p.exists():
            return []
        out = []
        with open(p, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # torn final write of a killed run
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and "m" in rec and "status" in rec:
                    out.append(rec)
        return out

    def _index(self, r: dict[str, Any]) -> None:
        k = (int(r["m"]), str(r.get("key")), str(r.get("stage")))
        self._seen.add((*k, str(r["status"])))
        if r["status"] in ("timed", "failed", "checked"):
            self._timed[k] = r

    def lookup(self, m: int, key: str, stage: str) -> dict[str, Any] | None:
        """A timed/failed/checked record from this or an earlier (killed) run, if any."""
        return self._timed.get((m, key, stage))

    def failed_keys(self) -> set[str]:
        """Configs that failed (compile, run or correctness) at any batch size."""
        return {k for (_, k, _), r in self._timed.items() if r["status"] == "failed"}

    def reasons(self, status: str, m: int | None = None) -> dict[str, str]:
        """Config key -> the reason its latest record of `status` ('failed' or 'pruned') gave,
        at batch size `m` or at any (this run's records and a killed run's)."""
        out: dict[str, str] = {}
        for r in self._records:
            if r["status"] == status and (m is None or int(r["m"]) == m):
                out[str(r.get("key"))] = str(r.get("reason") or "(no reason recorded)")
        return out

    def append(self, rec: dict[str, Any]) -> None:
        """Write one record (skips an identical pruned record already logged); records other
        than prunings carry `unix_s`, when they were written, so a run's wall can be traced."""
        k = (int(rec["m"]), str(rec.get("key")), str(rec.get("stage")), str(rec["status"]))
        if rec["status"] == "pruned" and k in self._seen:
            return
        if rec["status"] != "pruned":
            rec = {**rec, "unix_s": round(time.time(), 3)}
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
        self._records.append(rec)
        self._index(rec)

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self._records)


def vllm_config_json(
    entries: Mapping[int, Mapping[str, int]], triton_version: str | None, rocm: bool
) -> str:
    """vLLM's tuned-config file text: {"triton_version": ..., "<M>": {BLOCK_SIZE_M: ...}}.

    Keys are batch sizes as strings in increasing order; values carry vLLM's six keys, plus
    the ROCm keys present in the config when `rocm` is true.
    """
    out: dict[str, Any] = {}
    if triton_version:
        out["triton_version"] = triton_version
    for m in sorted(entries):
        cfg = entries[m]
        val = {k: int(cfg[k]) for k in VLLM_KEYS}
        if rocm:
            val.update({k: int(cfg[k]) for k in ROCM_KEYS if k in cfg})
        out[str(m)] = val
    return json.dumps(out, indent=4) + "\n"


def write_vllm_config(
    folder: str | os.PathLike[str],
    file_name: str,
    entries: Mapping[int, Mapping[str, int]],
    triton_version: str | None,
    rocm: bool,
) -> Path:
    """Write the vLLM JSON atomically into `folder`; returns its path."""
    path = Path(folder) / file_name
    atomic_write_text(path, vllm_config_json(entries, triton_version, rocm), checksum=True)
    return path


def write_path_choices(
    folder: str | os.PathLike[str],
    config_file_name: str,
    choices: Mapping[int, Mapping[str, Any]],
) -> Path:
    """Write, atomically beside the vLLM JSON, which path the builtin kernel's whole call was
    measured faster on per batch size: {"<M>": {"config": {...}, "path": "decode"|"grouped",
    "grouped_us": .., "decode_us": ..}} (what `kernels.load_path_choices` reads)."""
    table = {}
    for m in sorted(choices):
        c = choices[m]
        if c.get("path") not in ("decode", "grouped") or not isinstance(c.get("config"), Mapping):
            raise ValueError(f"path choice at M={m}: needs a config and a path, got {dict(c)}")
        table[str(m)] = {"config": {k: int(v) for k, v in c["config"].items()}, **{
            k: c[k] for k in ("path", "grouped_us", "decode_us", "decode_error",
                              "decode_failed") if k in c}}  # fmt: skip
    path = Path(folder) / path_choices_file_name(config_file_name)
    atomic_write_json(path, table, checksum=True)
    return path


def write_tuned_csv(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """AITER tuned_fmoe.csv: the columns above in that order; missing values left empty."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=AITER_COLUMNS, extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in AITER_COLUMNS})
    atomic_write_text(path, buf.getvalue())
