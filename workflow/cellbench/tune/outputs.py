"""What a finished tuning run keeps and says, apart from the file formats (artifacts.py).

In-container module: standard library only.

Split from cli.py: the output file names, the keep rule (`apply_keep`: a pick
no faster than vLLM's own config gives way to it), the CSV's rows, the table printed at the
end and the progress lines, so the device loop and the job share them without a cycle.
"""

from __future__ import annotations

from typing import Any

from cellbench.tune.plan import Plan

__all__ = ["apply_keep", "kept_line", "worker_line", "KEPT_PROGRESS", "LOG_NAME", "SUMMARY_NAME",
           "CSV_NAME"]  # fmt: skip

LOG_NAME = "tuning_log.jsonl"
SUMMARY_NAME = "summary.json"
CSV_NAME = "tuned_fmoe.csv"


# An entry's measurements of its pick's own kernel (timing kept in time_us as the baseline's).
_PICK_FIELDS = ("time_us", "spread", "samples_us", "error_vs_reference", "gemm1_us", "gemm2_us",
                "gemms_us", "kernel_path", "roofline", "config_name")  # fmt: skip
_VLLM_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
              "num_stages")  # fmt: skip
_ROCM_KEYS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def apply_keep(entries: dict[str, dict[str, Any]], keep: str) -> list[int]:
    """Under ``beats-baseline``, replace each pick that its side-by-side timing found no faster
    than the baseline (improvement_pct <= 0) with the baseline's config, keeping the pick under
    ``tuned_pick``; mark every entry ``kept``: pick or baseline (and why a slower pick stayed).
    Returns the batch sizes that now hold the baseline's config. Changes ``entries`` in place."""
    swapped = []
    for m, entry in entries.items():
        base = entry.get("baseline") or {}
        gain = entry.get("improvement_pct")
        entry["kept"] = "pick"
        if gain is None or gain > 0:
            continue
        config = {k: v for k, v in (base.get("config") or {}).items()
                  if k in _VLLM_KEYS + _ROCM_KEYS}  # fmt: skip
        if keep == "all":
            entry["kept"] = "pick (not faster than the baseline; --keep all)"
        elif any(not isinstance(config.get(k), int) or config[k] < 1 for k in _VLLM_KEYS):
            entry["kept"] = "pick (not faster, but the baseline's config is not a whole one)"
        else:
            # What was measured of the pick moves with it: none of it describes the baseline.
            moved = [k for k in _PICK_FIELDS if k in entry]
            entry["tuned_pick"] = {"config": entry["config"], **{k: entry.pop(k) for k in moved}}
            entry["config"] = config
            entry["config_name"] = f"vllm_{base.get('source', 'baseline')}_config"
            entry["roofline"] = {"fused": dict.fromkeys(
                ("roofline_fraction", "achieved_flops_per_s", "achieved_bytes_per_s"))}  # fmt: skip
            entry["time_us"] = base.get("time_us") or entry["tuned_pick"].get("time_us")
            entry["kept"] = "baseline"
            # measured for the pick's kernel: not a choice for the baseline's config
            entry.pop("path_choice", None)
            swapped.append(int(m))
    return sorted(swapped)


def _csv_rows(plan: Plan, entries: dict[str, Any], cu_num: int | None) -> list[dict[str, Any]]:
    s = plan.shape
    act = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
    a = act[plan.act_dtype]
    q = "torch.float8_e4m3fn" if s.dtype == "fp8_w8a8" else a
    if s.dtype == "fp8_w8a8":
        qt = (
            f"QuantType.per_{s.block_shape[0]}x{s.block_shape[1]}"
            if s.block_shape
            else ("QuantType.per_Tensor")
        )
    else:
        qt = "QuantType.No"
    rows = []
    for m in sorted(entries, key=int):
        e = entries[m]
        name = e["config_name"]
        fused = e["roofline"]["fused"]
        err = e.get("error_vs_reference")
        if e.get("kernel_path") == "decode":  # both GEMMs in one launch: AITER's "1-stage"
            stages = {"us1": _r(e.get("gemms_us")), "err1": _r(err, 6), "us2": 0,
                      "kernelName1": f"cellbench_{plan.backend}_triton_1stage_{name}",
                      "kernelName2": "", "err2": None, "run_1stage": 1}  # fmt: skip
        else:
            stages = {"us1": _r(e.get("gemm1_us")), "err1": _r(err, 6),
                      "us2": _r(e.get("gemm2_us")), "err2": _r(err, 6), "run_1stage": 0,
                      "kernelName1": f"cellbench_{plan.backend}_triton_gemm1_{name}",
                      "kernelName2": f"cellbench_{plan.backend}_triton_gemm2_{name}"}  # fmt: skip
        rows.append(
            {
                "cu_num": cu_num,
                "token": int(m),
                "model_dim": s.hidden_size,
                "inter_dim": s.intermediate_size,
                "expert": s.num_experts,
                "topk": s.topk,
                "act_type": "ActivationType.Silu",
                "dtype": a,
                "q_dtype_a": q,
                "q_dtype_w": q,
                "q_type": qt,
                "use_g1u1": 1,
                "doweight_stage1": 0,
                "block_m": e["config"]["BLOCK_SIZE_M"],
                "ksplit": 0,
                **stages,
                "us": _r(e["time_us"]),
                "tflops": _r(_scaled(fused.get("achieved_flops_per_s"), 1e12), 4),
                "bw": _r(_scaled(fused.get("achieved_bytes_per_s"), 1e9), 2),
                "_tag": "interpreter" if not plan.on_gpu else "",
            }
        )
    return rows


def _scaled(v: float | None, unit: float) -> float | None:
    return None if v is None else v / unit


def _r(v: float | None, nd: int = 3) -> float | None:
    """Round to nd decimals, keeping at least 4 significant digits for small values."""
    if v is None:
        return None
    v = float(v)
    return round(v, nd) if abs(v) >= 10 ** (3 - nd) or v == 0 else float(f"{v:.4g}")


def _human(summary: dict[str, Any]) -> str:
    lines = [
        f"cellbench tune: {summary['config_file']} ({summary['backend']}, {summary['mode']} mode"
        f"{', INTERPRETER timings' if summary['interpreter'] else ''})",
        f"{'M':>6} {'time_us':>10} {'gemm1':>9} {'gemm2':>9} {'roofline':>8} {'vs base':>8}"
        "  config",
    ]
    for m, e in sorted(summary["entries"].items(), key=lambda kv: int(kv[0])):
        rf = e["roofline"]["fused"]["roofline_fraction"]
        g1, g2 = e.get("gemm1_us"), e.get("gemm2_us")
        lines.append(
            f"{m:>6} {e['time_us']:>10.2f} {g1 if g1 is None else round(g1, 2)!s:>9} "
            f"{g2 if g2 is None else round(g2, 2)!s:>9} "
            f"{'n/a' if rf is None else f'{rf:.2f}':>8} {_gain_text(e):>8}  {e['config_name']}"
        )
    if summary.get("kept_baseline"):
        sizes = ", ".join(map(str, summary["kept_baseline"]))
        lines.append(
            f"kept vLLM's own config (the pick was no faster side by side) at M = {sizes}; "
            "--keep all writes every pick"
        )
    st = summary["counts"]
    sec = summary["seconds"]
    lines.append(
        f"candidates: {st['timed']} timed, {st['reused']} reused from log, {st['pruned']} pruned, "
        f"{st['failed']} failed; {st.get('new_kernels', 0)} new kernels compiled; seconds: wall "
        f"{sec['wall']:.1f}, cpu {sec['cpu']:.1f}, gpu {sec['gpu']:.1f}"
    )
    lines.append(log_line(summary))
    w = summary.get("compile_workers")
    if w and "ready" in w:
        lines.append(worker_line(w))
    return "\n".join(lines)


def log_line(summary: dict[str, Any]) -> str:
    """What the run did with the log it found: resumed it, set it aside (and why), or none."""
    log = summary.get("log") or {}
    resumed = summary.get("resumed_log_records", log.get("resumed_records", 0))
    if log.get("set_aside_records"):
        return (
            f"tuning log: {log['set_aside_records']} records of an earlier run set aside, not "
            f"resumed ({log.get('set_aside_because')}); every candidate above was tuned anew"
        )
    if resumed:
        return f"tuning log: resumed {resumed} records of an earlier run of this image"
    return "tuning log: none resumed (a new log)"


def _gain_text(entry: dict[str, Any]) -> str:
    """The pick's gain over the baseline (vLLM without the tuned file), e.g. '+12.3%'."""
    gain = entry.get("improvement_pct")
    if gain is None:
        return "n/a"
    return f"{gain:+.1f}%"


KEPT_PROGRESS = "[tune] kept"


def kept_line(m: int, timed: int, entry: dict[str, Any]) -> str:
    """One progress line per batch size once its baseline is timed: what was timed, what was
    kept, and what it gains over the config vLLM would use without the tuned file."""
    base = entry.get("baseline") or {}

    def us(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f} us"

    return (
        f"{KEPT_PROGRESS} M={m}: {timed} configs timed, kept {entry['config_name']} "
        f"{us(entry['time_us'])}; baseline ({base.get('source', 'n/a')}) "
        f"{us(base.get('time_us'))} vs the pick {us(base.get('tuned_time_us'))} side by side; "
        f"gain {_gain_text(entry)}"
    )


def worker_line(w: dict[str, Any]) -> str:
    """One line on the compile workers' start-up (`compile_workers` of the summary)."""
    return (
        f"compile workers ({'compile-only' if w.get('compile_only') else 'each opens the GPU'}):"
        f" ready {w['first_ready']:.1f}-{w['last_ready']:.1f} s after start (medians: process"
        f" up {w['worker_started']:.1f}, torch {w['torch_imported']:.1f}, kernels"
        f" {w['kernels_imported']:.1f}, ready {w['ready']:.1f})"
    )
