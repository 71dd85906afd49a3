"""The bisect's evidence table and the watch's one-screen summary, as Markdown/plain text."""

from __future__ import annotations


def _worst(rows: list[dict]) -> str:
    bad = [r for r in rows if r["verdict"] == "worse"]
    if not bad:
        return "-"
    return ", ".join(
        f"{r['point']} {r['metric']} {r['change_pct']:+.1f}%" if r["change_pct"] is not None
        else f"{r['point']} {r['metric']}"
        for r in bad
    )  # fmt: skip


def evidence_markdown(result: dict) -> str:
    setting = result["setting"]
    first = result["first_bad"]
    lines = [f"# Bisect of {setting['image']} on {setting['cell']}", ""]
    if first:
        lines.append(
            f"First bad image: **{first['ref']}** (digest `{first['digest']}`, vLLM "
            f"{first['vllm_version'] or 'n/a'} as its server answered GET /version)."
        )
    else:
        lines.append(f"No single first bad image: {result['answer']['why']}.")
        if result["answer"]["range"]:
            refs = [setting["refs"][i] for i in result["answer"]["range"]]
            lines.append("It is one of: " + ", ".join(refs) + ".")
    lines += [
        "",
        f"{result['steps']} steps (at most {result['max_steps']} without skips), "
        f"{result['wall_s']:.0f} s, {result['gpu_hours']:.3f} GPU-hours. Verdict: the "
        f"pipeline's, {setting['repeats']} interleaved pairs per point against the good ref "
        f"{setting['refs'][0]}, floor {setting['min_change_pct']:g}%.",
        "",
        "| step | candidate | digest | vLLM | outcome | worse (change) |",
        "|---|---|---|---|---|---|",
    ]
    for s in result["evidence"]:
        lines.append(
            f"| {s['step']} | {s['ref']} | `{s['digest'][:19]}` | {s.get('vllm_version') or 'n/a'}"
            f" | {s['outcome']} | {_worst(s['verdicts']) if s['verdicts'] else s['reason'][:120]} |"
        )
    return "\n".join(lines) + "\n"
