"""The printed table of tuner_default_vs_exhaustive_vllm_kernel.py, split out of it: per batch
size the whole-call times of default's pick, the shipped config and exhaustive's pick, each
mode's tuner wall, and the target lines (default never slower than shipped beyond noise;
default against exhaustive walls)."""

from __future__ import annotations

import tuner_default_mode_cost as th


def walls(d: dict, e: dict, ems, timings: dict[int, int]) -> dict:
    """Default/exhaustive wall over the batch sizes exhaustive covered (measured, from each run's
    per-M tuning wall), and exhaustive's wall over all of default's batch sizes extrapolated:
    its measured seconds per timing at the covered M times the timings it would take at every
    M (`exhaustive_timings`), plus its run's seconds outside any batch size."""
    de, ee = d.get("entries", {}), e.get("entries", {})
    covered = [m for m in ems if str(m) in ee and str(m) in de]
    if not covered:
        return {}
    d_w = sum(de[str(m)]["tune_wall_s"] for m in covered)
    e_w = sum(ee[str(m)]["tune_wall_s"] for m in covered)
    per = e_w / sum(timings[m] for m in covered)
    outside = e["seconds"]["wall"] - sum(x["tune_wall_s"] for x in ee.values())
    all_ms = [int(m) for m in de]
    est = per * sum(timings[m] for m in all_ms) + max(outside, 0.0)
    # whole processes, start-up (imports, compile workers, checks) counted alike on both
    # sides: comparable only where default ran at exactly the batch sizes exhaustive covered
    same_ms = sorted(int(m) for m in de) == sorted(covered) == sorted(int(m) for m in ee)
    d_run, e_run = d.get("wall_outer_s"), e.get("wall_outer_s")
    return {
        "covered": covered,
        "same_batch_sizes": same_ms,
        "default_process_s": d_run,
        "exhaustive_process_s": e_run,
        "process_ratio": d_run / e_run if same_ms and d_run and e_run else None,
        "default_s": d_w,
        "exhaustive_s": e_w,
        "ratio": d_w / e_w,
        "exhaustive_s_per_timing": per,
        "all_ms": all_ms,
        "exhaustive_timings_all": sum(timings[m] for m in all_ms),
        "exhaustive_all_estimated_s": est,
        "default_run_s": d["seconds"]["wall"],
        "ratio_all_estimated": d["seconds"]["wall"] / est,
    }


def _get(s: dict, label: str, key: str):
    return s.get(label, {}).get(key)


def _ratio(a, b):
    return a / b if a and b else None


def _noise(x: float | None) -> float:
    """The relative difference two medians of one side-by-side run must exceed to differ (the
    tuner's own rule: the measured spread, at least 0.5 %)."""
    return max(x or 0.0, 0.005)


def table(dtype: str, ms, d: dict, e: dict, sbs: dict, ems, left_out, timings=None) -> str:
    f = th.fmt
    builtin = any(k.startswith("builtin") for s in sbs.values() for k in s)
    lines = [f"== {dtype}: Qwen3-30B-A3B TP=1, vLLM's kernel (from its wheel) tuned by the tuner"]
    lines.append(
        "whole fused call, us (interleaved graph replays, this script): vLLM's kernel with "
        "default's pick (def), vLLM's shipped config (ship), exhaustive's pick (exh); "
        "tuner def/ship: the default run's own side-by-side re-time of the two (20 repeats); "
        "wall: each mode's tuning seconds at that M"
    )
    head = (
        f"{'M':>5} {'def':>9} {'ship':>9} {'def/ship':>8} {'exh':>9} {'def/exh':>7} "
        f"{'spread':>6} | {'tuner def/ship':>14} | {'wall def':>8} {'wall exh':>8} |"
    )
    if builtin:
        head += (f" {'b:def':>9} {'b/v def':>7} {'b/v ship':>8} {'bg/v ship':>9} | GEMMs "
                 f"{'b/v def':>7} {'b/v ship':>8} |")  # fmt: skip
    lines.append(head + " default pick")
    de, ee = d.get("entries", {}), e.get("entries", {}) if e else {}
    worst_ship: tuple | None = None  # (ratio - 1 - noise, ratio, m, noise, source)
    worst_exh: dict[bool, tuple] = {}  # M <= 256 -> (excess, ratio, m, noise)
    for m in ms:
        s = sbs.get(m, {})
        vd, vs_ = _get(s, "vllm:default", "call_us"), _get(s, "vllm:shipped", "call_us")
        ve = _get(s, "vllm:exhaustive", "call_us")
        spread = max((x.get("call_spread", 0) for k, x in s.items() if k != "ratios"), default=None)
        a, x = de.get(str(m)), ee.get(str(m))
        base = (a or {}).get("baseline") or {}
        tb = _ratio(base.get("tuned_time_us"), base.get("time_us"))
        row = (
            f"{m:>5} {f(vd):>9} {f(vs_):>9} {f(_ratio(vd, vs_), 3):>8} {f(ve):>9} "
            f"{f(_ratio(vd, ve), 3):>7} {f(spread, 3):>6} | {f(tb, 3):>14} | "
            f"{f(a and a['tune_wall_s'], 1):>8} {f(x and x['tune_wall_s'], 1):>8} |"
        )
        if builtin:
            bd, bs = _get(s, "builtin:default", "call_us"), _get(s, "builtin:shipped", "call_us")
            bgs = _get(s, "builtin-grouped:shipped", "call_us")
            gvd, gbd = _get(s, "vllm:default", "gemms_us"), _get(s, "builtin:default", "gemms_us")
            gvs, gbs = _get(s, "vllm:shipped", "gemms_us"), _get(s, "builtin:shipped", "gemms_us")
            row += (
                f" {f(bd):>9} {f(_ratio(bd, vd), 3):>7} {f(_ratio(bs, vs_), 3):>8} "
                f"{f(_ratio(bgs, vs_), 3):>9} | {f(_ratio(gbd, gvd), 3):>13} "
                f"{f(_ratio(gbs, gvs), 3):>8} |"
            )
        lines.append(f"{row} {a['config_name'] if a else '-'}")
        # this script's re-time where it ran, else the default run's own
        r, nz, src = _ratio(vd, vs_), _noise(spread), "this script"
        if r is None and tb is not None:
            r, nz, src = tb, _noise(a.get("spread")), "the default run"
        if r is not None and (worst_ship is None or r - 1 - nz > worst_ship[0]):
            worst_ship = (r - 1 - nz, r, m, nz, src)
        rx = _ratio(vd, ve)
        if rx is not None:
            small = m <= 256  # the issue: within 1 % at M <= 256, within noise above
            excess = rx - 1.01 if small else rx - 1 - _noise(spread)
            if small not in worst_exh or excess > worst_exh[small][0]:
                worst_exh[small] = (excess, rx, m, _noise(spread))
    for part, who in ((d.get("vllm_kernel") or {}).get("parts") or {}).items():
        lines.append(f"vLLM call's {part}: {who}")
    lines.append(th._cost_line("default", d))
    if e:
        lines.append(th._cost_line("exhaustive", e))
    lines += _target_lines(d, e, ms, ems, timings, worst_ship, worst_exh)
    if left_out:
        lines.append(f"not re-timed by this script (wall budget spent): M={_ms(left_out)}")
    return "\n".join(lines)


def _ms(ms) -> str:
    return ",".join(map(str, ms))


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _target_lines(d, e, ms, ems, timings, worst_ship, worst_exh) -> list[str]:
    """The issue's targets judged on this run's figures, one line each."""
    out = ["The targets on vLLM's kernel, judged on this run:"]
    if d.get("seconds"):
        w, n = d["seconds"]["wall"], len(d.get("entries", {}))
        verdict = _met(w <= 120) if n == 18 and d.get("complete") else "not judged"
        out.append(f"  default mode, {n} batch sizes: wall {w:.1f} s (target <= 120 s for all "
                   f"18: {verdict})")  # fmt: skip
    if worst_ship is not None:
        _, r, m, nz, src = worst_ship
        out.append(f"  default's pick vs the shipped config: worst def/ship {r:.3f} at M={m} "
                   f"(noise {nz:.3f}, re-timed by {src}): never slower beyond noise: "
                   f"{_met(r <= 1 + nz)}")  # fmt: skip
    if not e or e.get("failed"):
        out.append("  default vs exhaustive: exhaustive did not run (no wall budget left)")
        return out
    w = walls(d, e, ems, timings) if timings else {}
    if not w:
        out.append(f"  default vs exhaustive: exhaustive finished no batch size of M={_ms(ems)}")
        return out
    if len(w["covered"]) < len(ms):
        out.append(f"  exhaustive ran at M={_ms(w['covered'])} only, {len(w['covered'])} of the "
                   f"{len(ms)} batch sizes (a full sweep does not fit the budget)")  # fmt: skip
    if w.get("process_ratio") is not None:
        out.append(f"  measured, whole tuner processes (start-up included on both sides) at "
                   f"M={_ms(w['covered'])}: default {w['default_process_s']:.1f} s / exhaustive "
                   f"{w['exhaustive_process_s']:.1f} s = {w['process_ratio']:.3f}")  # fmt: skip
    out.append(f"  tuning wall at M={_ms(w['covered'])}: default {w['default_s']:.1f} s / "
               f"exhaustive {w['exhaustive_s']:.1f} s = {w['ratio']:.3f} (target <= 0.1: "
               f"{_met(w['ratio'] <= 0.1)})")  # fmt: skip
    out.append(
        f"  estimate, not measured: exhaustive at all {len(w['all_ms'])} M ~ "
        f"{w['exhaustive_all_estimated_s']:.0f} s ({w['exhaustive_s_per_timing']:.3f} s per "
        f"timing as measured at M={_ms(w['covered'])} x {w['exhaustive_timings_all']} timings "
        f"counted on the CPU from the pruned space); default's whole run "
        f"{w['default_run_s']:.1f} s / that = {w['ratio_all_estimated']:.3f}"
    )
    for small, label, bound in ((True, "M <= 256", "1.01"), (False, "M > 256", "1 + noise")):
        if small in worst_exh:
            _, r, m, nz = worst_exh[small]
            lim = 1.01 if small else 1 + nz
            out.append(f"  default's pick vs exhaustive's, {label}: worst def/exh {r:.3f} at "
                       f"M={m} (target <= {bound}: {_met(r <= lim)})")  # fmt: skip
    return out
