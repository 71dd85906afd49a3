#!/usr/bin/env python3
"""The tuner's default mode against exhaustive on vLLM's kernel over the pre-registered lists.

The lists, dtypes, targets and plan are in benchmarks/tuner_lists.json, committed before the
device run. This script runs the steps one device call holds, in the order given:

  tune:DTYPE:MODE:LIST[:LO-HI][@CAP][/wN]  one tuner process (`cellbench.tune --backend vllm`,
        fresh Triton cache, vLLM's shipped H200 file as seed) over LIST's sizes (only those in
        LO..HI if given), its own time budget at most CAP seconds, N compile workers (default
        --compile-workers); its process wall (start to exit) is measured here. DTYPE: fp8
        (block [128,128]) or bf16; MODE: default or exhaustive.
  retime:DTYPE  per batch size, every config some run picked there (each list's default pick,
        exhaustive's, for bf16 the recorded exhaustive picks, vLLM's shipped config), each once,
        re-timed side by side (interleaved CUDA-graph replays of the whole fused call, same
        inputs, outputs checked against the float64 reference first), in this process, with the
        Triton caches of this call's runs merged so nothing is compiled twice.

Runs of earlier calls are read from --runs-from (their runs JSON, committed in between), so a
re-time can hold picks from several calls. Outputs in --out: runs_<tag>.json (each run's
summary and process wall), retime_<tag>.json, logs_<tag>.tar.gz (tuning logs), written after
every step, so a call cut short keeps what finished.

Other actions (no GPU): `recorded-picks FILE` writes the bf16 exhaustive picks of the
committed H100 runs (git history and tree); `report DIR` prints the tables from a results
folder. `--smoke` runs the steps on a tiny shape under the CPU interpreter (sizes capped at 16,
bf16 only: a check that the script runs, not a measurement).

    python3 benchmarks/tuner_any_list.py run --out $OUT --budget-s 560 --tag call1 \\
        tune:fp8:default:standard18 tune:fp8:exhaustive:standard18:1-2048
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tuner_default_mode_cost as th  # noqa: E402 - run_mode, shapes, shipped configs
import tuner_default_vs_exhaustive_vllm_kernel as vk  # noqa: E402 - sources, side by side
from cellbench.common import atomicio  # noqa: E402

LISTS_FILE = ROOT / "benchmarks" / "tuner_lists.json"
DTYPES = ("fp8", "bf16")
MODES = ("default", "exhaustive")
SMOKE_MAX_M = 16
# bf16 exhaustive picks of the committed H100 runs (vLLM 0.34.0's kernel, NVIDIA H100 80GB
# HBM3): (git commit or None for the tree, path); the first left the tree after that commit.
RECORDED_BF16 = (
    # The folder's name at that commit (renamed since; git show reads the commit's tree).
    ("03662fa", "benchmarks/results/issue33_h100_2026-12-05/tuner_vllm_kernel_h200_bf16.json"),
    (None, "benchmarks/results/vllm_ops_h100_2026-12-05/"
           "tuner_vllm_kernel_h100_bf16_M512-1536.json"),
    (None, "benchmarks/results/vllm_ops_h100_2026-12-05/tuner_vllm_kernel_h100_bf16_M4096.json"),
)  # fmt: skip
SUMMARY_DROP = ("space", "ceilings", "hardware_limits", "per_device", "compile_workers")


def load_lists(smoke: bool = False) -> dict[str, list[int]]:
    lists = json.loads(LISTS_FILE.read_text())["lists"]
    if smoke:
        lists = {k: sorted({min(m, SMOKE_MAX_M) for m in v}) for k, v in lists.items()}
    return lists


def parse_step(text: str, lists: dict[str, list[int]]) -> dict:
    """A step string -> {kind, dtype, ...}; ValueError naming the part that is wrong."""
    text_all = text
    text, _, workers = text.partition("/w")
    try:
        n_workers = int(workers) if workers else None
    except ValueError:
        raise ValueError(f"step {text_all!r}: /wN must be a number of compile workers") from None
    step = _parse_step(text, lists)
    step.update(text=text_all, workers=n_workers)
    return step


def _parse_step(text: str, lists: dict[str, list[int]]) -> dict:
    body, _, cap = text.partition("@")
    parts = body.split(":")
    if parts[0] == "retime" and len(parts) == 2 and parts[1] in DTYPES and not cap:
        return {"kind": "retime", "dtype": parts[1], "text": text}
    if parts[0] != "tune" or len(parts) not in (4, 5):
        raise ValueError(f"step {text!r}: expected tune:DTYPE:MODE:LIST[:LO-HI][@CAP][/wN] or "
                         "retime:DTYPE")  # fmt: skip
    _, dtype, mode, name, *rng = parts
    if dtype not in DTYPES or mode not in MODES or name not in lists:
        raise ValueError(f"step {text!r}: DTYPE one of {DTYPES}, MODE one of {MODES}, LIST one "
                         f"of {sorted(lists)}")  # fmt: skip
    ms = lists[name]
    tag = f"{dtype}-{mode}-{name}"
    if rng:
        lo, _, hi = rng[0].partition("-")
        try:
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            raise ValueError(f"step {text!r}: LO-HI must be two integers, e.g. 1-2048") from None
        ms = [m for m in ms if lo_i <= m <= hi_i]
        tag += f"-M{lo_i}-{hi_i}"
    if not ms:
        raise ValueError(f"step {text!r}: no batch size of {name} left")
    try:
        cap_s = float(cap) if cap else None
    except ValueError:
        raise ValueError(f"step {text!r}: @CAP must be seconds") from None
    return {"kind": "tune", "dtype": dtype, "mode": mode, "list": name, "ms": ms, "tag": tag,
            "cap_s": cap_s, "text": text}  # fmt: skip


def trim(summary: dict) -> dict:
    """A run's summary without the bulky parts the tables never read."""
    out = {k: v for k, v in summary.items() if k not in SUMMARY_DROP}
    for e in out.get("entries", {}).values():
        e.pop("roofline", None)
    return out


class Call:
    """One device call's state: the runs so far (this call's and earlier ones'), caches, outputs."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = time.perf_counter()
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="tuner-any-list-"))
        self.runs: dict[str, dict] = {}
        self.earlier: dict[str, dict] = {}
        for f in a.runs_from or []:
            self.earlier.update(json.loads(Path(f).read_text())["runs"])
        self.caches: dict[str, list[str]] = {d: [] for d in DTYPES}
        self.retimes: dict[str, dict] = {}
        self.meta: dict = {}

    def left(self) -> float:
        return self.a.budget_s - (time.perf_counter() - self.t0)

    def save(self) -> None:
        tag = self.a.tag
        atomicio.write_json(self.out / f"runs_{tag}.json", {"meta": self.meta, "runs": self.runs})
        if self.retimes:
            atomicio.write_json(self.out / f"retime_{tag}.json",
                                {"meta": self.meta, "retime": self.retimes})  # fmt: skip
        logs = sorted(self.work.glob("*/tuning_log.jsonl"))
        if logs:
            tmp = self.out / f".logs_{tag}.tar.gz"
            with tarfile.open(tmp, "w:gz") as tar:
                for p in logs:
                    tar.add(p, arcname=f"{p.parent.name}.jsonl")
            tmp.replace(self.out / f"logs_{tag}.tar.gz")

    def tune(self, step: dict) -> None:
        budget = self.left() - 15
        if step["cap_s"] is not None:
            budget = min(budget, step["cap_s"])
        if budget < 20:
            print(f"{step['text']}: skipped ({self.left():.0f} s of the call left)", flush=True)
            self.runs[step["tag"]] = {"skipped": True, "left_s": self.left(), "step": step}
            return
        dtype, smoke = step["dtype"], self.a.smoke
        cache = tempfile.mkdtemp(prefix=f"triton-{step['tag']}-")
        extra = ["--backend", "vllm", "--vllm-source", os.environ["CELLBENCH_VLLM_SOURCE"]]
        if not smoke:  # fewer workers where their GPU memory would not fit (large M)
            extra += ["--compile-workers", str(step["workers"] or self.a.compile_workers)]
        seed = th.REF_DIR / vk.SHIP[dtype] if step["mode"] == "default" else None
        print(f"== {step['text']}: M={','.join(map(str, step['ms']))}, budget {budget:.0f} s, "
              f"{self.left():.0f} s of the call left", flush=True)  # fmt: skip
        s = th.run_mode(self.model_cfg, dtype, step["mode"], step["ms"], self.work / step["tag"],
                        budget, smoke, seed, cache_dir=cache, extra=extra)  # fmt: skip
        self.caches[dtype].append(cache)
        self.runs[step["tag"]] = {"step": step, **trim(s)}
        if s.get("failed"):
            print(f"{step['text']}: FAILED (rc {s.get('rc')})", flush=True)
            return
        print(f"{step['text']}: process {s['wall_outer_s']:.1f} s, wall {s['seconds']['wall']:.1f}"
              f" s, complete={s.get('complete')} skipped={s.get('skipped_batch_sizes')}",
              flush=True)  # fmt: skip

    def picks(self, dtype: str) -> dict[int, dict[str, dict]]:
        """Per batch size: label -> config, every run of this dtype (this call's and earlier),
        the recorded exhaustive picks (bf16) and the shipped config."""
        out: dict[int, dict[str, dict]] = {}
        for r in {**self.earlier, **self.runs}.values():
            st = r.get("step", {})
            if st.get("dtype") != dtype or r.get("failed") or r.get("skipped"):
                continue
            label = "exhaustive" if st["mode"] == "exhaustive" else f"default:{st['list']}"
            for m, e in r.get("entries", {}).items():
                out.setdefault(int(m), {})[label] = e["config"]
        if dtype == "bf16" and self.a.recorded and not self.a.smoke:
            rec = json.loads(Path(self.a.recorded).read_text())["picks"]
            for m, e in rec.items():
                if int(m) in out:
                    out[int(m)]["exhaustive-recorded"] = e["config"]
        shipped = th.shipped_configs(vk.SHIP[dtype])
        for m in out:
            if shipped and not self.a.smoke:
                out[m]["shipped"] = th.nearest(shipped, m)
        return out

    def retime(self, step: dict) -> None:
        dtype = step["dtype"]
        runs = [r for r in {**self.earlier, **self.runs}.values()
                if r.get("step", {}).get("dtype") == dtype and "shape" in r]  # fmt: skip
        if not runs:
            print(f"{step['text']}: no {dtype} run to re-time", flush=True)
            return
        merged = tempfile.mkdtemp(prefix=f"triton-retime-{dtype}-")
        for c in self.caches[dtype]:
            shutil.copytree(c, merged, dirs_exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = merged
        import torch
        from cellbench.tune import spaces
        from cellbench.tune.backends import VllmBackend
        from cellbench.tune.shapes import MoEShape

        on_gpu = torch.cuda.is_available()
        be = VllmBackend(MoEShape.from_dict(runs[0]["shape"]), runs[0]["compute_dtype"],
                         "cuda" if on_gpu else "cpu")  # fmt: skip
        labelled = self.picks(dtype)
        unique: dict[int, dict[str, dict]] = {}  # m -> config key -> config (each timed once)
        for m, named in labelled.items():
            for cfg in named.values():
                unique.setdefault(m, {})[spaces.config_key(cfg)] = cfg
        # sizes with an exhaustive reference first, then the rest by size
        order = sorted(unique, key=lambda m: (not ({"exhaustive", "exhaustive-recorded"}
                                                   & set(labelled[m])), m))  # fmt: skip
        deadline = time.perf_counter() + self.left() - 5
        print(f"== {step['text']}: {len(order)} batch sizes, "
              f"{sum(map(len, unique.values()))} configs", flush=True)  # fmt: skip
        res, left_out = vk.side_by_side(be, order, unique, on_gpu, deadline)
        self.retimes[dtype] = {
            "device": torch.cuda.get_device_name(0) if on_gpu else "CPU (interpreter smoke)",
            "labels": {
                str(m): {lab: spaces.config_key(c) for lab, c in named.items()}
                for m, named in labelled.items()
            },  # fmt: skip
            "timed": {
                str(m): {k.removeprefix("vllm:"): v for k, v in r.items()} for m, r in res.items()
            },  # fmt: skip
            "not_retimed": left_out,
        }
        del be
        if on_gpu:
            torch.cuda.empty_cache()

    def run(self, steps: list[dict]) -> int:
        refusal = vk.prepare_run(self.a.vllm_source, self.a.smoke)
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
        import torch
        import triton

        self.meta = {**th.run_meta(torch, triton, torch.cuda.is_available()),
                     "vllm_source": vk.source_record(self.a.vllm_source), "smoke": self.a.smoke,
                     "steps": [s["text"] for s in steps], "budget_s": self.a.budget_s,
                     "runs_from": self.a.runs_from, "lists_file": LISTS_FILE.name}  # fmt: skip
        print("\n".join(f"{k}: {v}" for k, v in self.meta.items()), flush=True)
        self.model_cfg = self.work / "config.json"
        self.model_cfg.write_text(json.dumps(th.TINY if self.a.smoke else th.QWEN3_30B))
        for step in steps:
            if step["kind"] == "tune":
                self.tune(step)
            else:
                self.retime(step)
            self.save()
        for line in report_lines(self.runs, self.retimes, self.earlier):
            print(line)
        print(f"call wall {time.perf_counter() - self.t0:.1f} s", flush=True)
        return 0


def report_lines(runs: dict, retimes: dict, earlier: dict | None = None) -> list[str]:
    """The tables: each run's walls, then per dtype, list and size default's pick against
    exhaustive's (measured or recorded) and the shipped config, as re-timed side by side."""
    lines = ["run                                      process s  wall s  complete  skipped"]
    for tag, r in runs.items():
        if r.get("skipped") or r.get("failed"):
            lines.append(f"{tag:<40} {'skipped' if r.get('skipped') else 'FAILED'}")
            continue
        lines.append(f"{tag:<40} {r['wall_outer_s']:>9.1f} {r['seconds']['wall']:>7.1f}  "
                     f"{r.get('complete')!s:<8}  {r.get('skipped_batch_sizes') or ''}")  # fmt: skip
    lines += wall_lines(runs)
    for dtype, rt in retimes.items():
        lines.append(f"== {dtype} re-timed side by side on {rt['device']} (whole fused call, us)")
        lines.append("list        M     default  reference   def/ref  spread  def/ship  ref is")
        lists = sorted({lab.split(":", 1)[1] for named in rt["labels"].values()
                        for lab in named if lab.startswith("default:")})  # fmt: skip
        for name in lists:
            for m in sorted(rt["labels"], key=int):
                lines.append(_row(name, m, rt))
        lines += target_lines(dtype, rt, lists)
    return [x for x in lines if x]


def _ratios(rt: dict, name: str) -> tuple[dict[int, float], list[int]]:
    """(size -> default/reference where both were re-timed, sizes with no reference)."""
    got, none = {}, []
    for m, labels in rt["labels"].items():
        key, timed = labels.get(f"default:{name}"), rt["timed"].get(m, {})
        ref = labels.get("exhaustive") or labels.get("exhaustive-recorded")
        if key is None:
            continue
        d, r = timed.get(key, {}).get("call_us"), timed.get(ref, {}).get("call_us")
        if d and r:
            got[int(m)] = d / r
        else:
            none.append(int(m))
    return got, sorted(none)


def target_lines(dtype: str, rt: dict, lists: list[str]) -> list[str]:
    """Per list: the worst default/reference ratio, and the sizes over the 1.01 target."""
    target = json.loads(LISTS_FILE.read_text())["targets"]["pick_ratio_max"]
    out = []
    for name in lists:
        got, none = _ratios(rt, name)
        if not got:
            continue
        worst = max(got, key=got.get)
        over = [m for m, r in sorted(got.items()) if r > target]
        tail = f"; no reference at M={','.join(map(str, none))}" if none else ""
        out.append(
            f"{dtype} {name}: def/ref {min(got.values()):.3f}-{got[worst]:.3f} at "
            f"{len(got)} sizes (worst M={worst}); over {target}: {over or 'none'}{tail}"
        )
    return out


def wall_lines(runs: dict) -> list[str]:
    """Default's process wall over the standard sizes against exhaustive's, whose parts ran as
    separate processes: their walls summed (start-up counted once a process) and, to count it
    once as on default's side, every part after the first less its time outside the per-size
    tuning (start-up, baseline, outputs): the larger, more conservative ratio."""
    out = []
    for dtype in DTYPES:
        d = runs.get(f"{dtype}-default-standard18")
        parts = [r for t, r in runs.items() if t.startswith(f"{dtype}-exhaustive-standard18")
                 and "wall_outer_s" in r]  # fmt: skip
        if not d or "wall_outer_s" not in d or not parts:
            continue
        covered = sorted({int(m) for p in parts for m in p.get("entries", {})})
        exh = sum(p["wall_outer_s"] for p in parts)
        extra = sum(p["wall_outer_s"] - sum(e["tune_wall_s"] for e in p["entries"].values())
                    for p in parts[1:])  # fmt: skip
        dw = d["wall_outer_s"]
        out.append(f"{dtype} process walls: default {dw:.1f} s over {len(d['entries'])} sizes; "
                   f"exhaustive {exh:.1f} s over {len(covered)} sizes in {len(parts)} "
                   f"processes: {dw / exh:.3f}; exhaustive's start-up counted once "
                   f"({exh - extra:.1f} s): {dw / (exh - extra):.3f}")  # fmt: skip
        sec, n = d["seconds"], d["counts"]["timed"]
        out.append(f"{dtype} default: {n} timings, GPU {sec['gpu']:.1f} s "
                   f"({sec['gpu'] / n * 1e3:.0f} ms a timing, {sec['gpu'] / exh:.3f} of "
                   f"exhaustive's process wall), waiting for compile workers "
                   f"{sec['compile_wait']:.1f} s, setup {sec['setup']:.1f} s; a tenth of "
                   f"exhaustive's is {exh / 10:.1f} s")  # fmt: skip
    return out


def _row(name: str, m: str, rt: dict) -> str:
    labels, timed = rt["labels"][m], rt["timed"].get(m)
    key = labels.get(f"default:{name}")
    if key is None:
        return ""
    if timed is None:
        return f"{name:<10} {m:>5}  not re-timed"
    d = timed.get(key, {})
    ref_lab = next((x for x in ("exhaustive", "exhaustive-recorded") if x in labels), None)
    ref = timed.get(labels[ref_lab], {}) if ref_lab else {}
    ship = timed.get(labels.get("shipped", ""), {})
    du, ru, su = d.get("call_us"), ref.get("call_us"), ship.get("call_us")
    spread = max(d.get("call_spread") or 0, ref.get("call_spread") or 0)
    r = f"{du / ru:.3f}" if du and ru else "-"
    s = f"{du / su:.3f}" if du and su else "-"
    return (f"{name:<10} {m:>5} {du or 0:>10.2f} {ru or 0:>10.2f} {r:>9} {spread:>7.3f} "
            f"{s:>9}  {ref_lab or 'none (shipped only)'}")  # fmt: skip


def recorded_picks(path: Path) -> int:
    """The bf16 exhaustive picks of the committed H100 runs, from git history and the tree."""
    picks, sources = {}, []
    for commit, rel in RECORDED_BF16:
        if commit:
            text = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout  # fmt: skip
        else:
            text = (ROOT / rel).read_text()
        d = json.loads(text)
        for m, e in d["exhaustive"]["entries"].items():
            picks[m] = {"config": e["config"], "config_name": e["config_name"],
                        "time_us": e["time_us"], "device": d["meta"]["device"]}  # fmt: skip
        sources.append(f"{commit + ':' if commit else ''}{rel}")
    atomicio.write_json(path, {"what": "bf16 exhaustive picks of the committed H100 runs",
                               "sources": sources, "picks": picks})  # fmt: skip
    print(f"{path}: {len(picks)} batch sizes ({', '.join(sorted(picks, key=int))})")
    return 0


def report(folder: Path, upto: str | None = None, md: Path | None = None) -> int:
    """The tables from every call's files in folder (a later call's run or re-time of the
    same name stands), or from the calls whose tag sorts up to `upto` only."""
    runs: dict = {}
    retimes: dict = {}
    for f in sorted(folder.glob("runs_*.json")):
        if upto is None or f.stem.removeprefix("runs_") <= upto:
            runs.update(json.loads(f.read_text())["runs"])
    for f in sorted(folder.glob("retime_*.json")):
        if upto is None or f.stem.removeprefix("retime_") <= upto:
            retimes.update(json.loads(f.read_text())["retime"])
    lines = report_lines(runs, retimes)
    for line in lines:
        print(line)
    if md is not None:  # the same tables as a page, named as a script's table is
        cards = sorted({rt["device"] for rt in retimes.values()})
        head = [f"# Tables of {folder.name}{' up to ' + upto if upto else ''}", "",
                f"Written by `python3 benchmarks/tuner_any_list.py report {folder}"
                f"{' --upto ' + upto if upto else ''} --md {md}` from the runs and re-times "
                f"there; card of every figure: {', '.join(cards)}.", "", "```"]  # fmt: skip
        atomicio.write_text(md, "\n".join(head + lines + ["```", ""]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("run", "recorded-picks", "report"))
    ap.add_argument("args", nargs="*", help="run: steps; recorded-picks: FILE; report: DIR")
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/tmp")
    ap.add_argument("--tag", default="call", help="run: the output files' suffix")
    ap.add_argument("--upto", help="report: only the calls whose tag sorts up to this one")
    ap.add_argument("--md", help="report: also write the tables as a markdown page here")
    ap.add_argument("--budget-s", type=float, default=560.0, help="run: wall budget of the call")
    ap.add_argument("--runs-from", action="append", help="run: runs JSON of an earlier call")
    ap.add_argument("--recorded", help="run: recorded bf16 exhaustive picks (recorded-picks)")
    ap.add_argument("--compile-workers", type=int, default=12)
    ap.add_argument("--smoke", action="store_true", help="tiny shape, CPU interpreter, M <= 16")
    ap.add_argument("--vllm-source", default=os.environ.get("CELLBENCH_VLLM_SOURCE")
                    or str(vk.DEFAULT_SOURCE))  # fmt: skip
    a = ap.parse_intermixed_args()
    if a.action == "recorded-picks":
        if len(a.args) != 1:
            ap.error("recorded-picks: expected one FILE")
        return recorded_picks(Path(a.args[0]))
    if a.action == "report":
        if len(a.args) != 1:
            ap.error("report: expected one results folder")
        return report(Path(a.args[0]), a.upto, Path(a.md) if a.md else None)
    lists = load_lists(a.smoke)
    try:
        steps = [parse_step(s, lists) for s in a.args]
    except ValueError as e:
        ap.error(str(e))
    if not steps:
        ap.error("run: give at least one step")
    if a.smoke and any(s["dtype"] != "bf16" for s in steps):
        ap.error("--smoke: bf16 steps only (fp8 under the interpreter misses its error bound)")
    for f in (a.runs_from or []) + ([a.recorded] if a.recorded else []):
        if not Path(f).is_file():
            ap.error(f"--runs-from/--recorded: no file {f}")
    return Call(a).run(steps)


if __name__ == "__main__":
    sys.exit(main())
