"""The stage test's timed-server pair (tests/stage/test_comparison.py) measured N times, with
its OSL, repeats and prompts per point as arguments; one RESULT line per run (what the test
checks: the TPOT change, its interval, p, the verdict, each repeat's TPOT, the load average).

    python benchmarks/stage_tpot_under_load.py N PCTS OSL REPEATS PROMPTS
    bash benchmarks/stage_tpot_under_load.sh N PCTS OSL REPEATS PROMPTS OUT   # beside 2 busy loops
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from cellbench.report import frames
from cellbench.serve import stage as serve_stage
from cellbench.stats import comparison

CELL = "host-cpu/timed/tp1-ep1"
ITL_MS = 20.0


def measure(tmp: Path, slower_pct: float, osl: int, repeats: int, prompts: int):
    """As the test's _measure_pair: the tuned arm's server sends tokens slower_pct % apart."""
    tuned_itl = ITL_MS * (1 + slower_pct / 100)
    script = (
        f"exec {sys.executable} -m cellbench.serve.timed_server --port {{port}} --ttft-ms 2 "
        f'--itl-ms $(if [ -n "$VLLM_TUNED_CONFIG_FOLDER" ]; then echo {tuned_itl}; '
        f"else echo {ITL_MS}; fi)"
    )
    tuned = tmp / "tune" / "configs"
    tuned.mkdir(parents=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    results = tmp / "results"
    out = results / CELL / "serve"
    args = [
        "--runtime", "local", "--cell-id", CELL, "--arm", "pair", "--model", "timed-model",
        "--server-command-json", json.dumps(["sh", "-c", script]),
        "--tuned-config-dir", str(tuned),
        "--lease-dir", str(tmp / "leases"), "--cache-dir", str(tmp / "cache"),
        "--grid-json", json.dumps([{"isl": 8, "osl": osl}]), "--concurrency", "1",
        "--prompts-per-concurrency", str(prompts), "--warmups-per-concurrency", "1",
        "--repeats", str(repeats), "--no-gsm8k", "--out-dir", str(out),
        "--image-digest", "local:timed-server",
    ]  # fmt: skip
    assert serve_stage.main(args) == 0
    files = [out / arm / "bench.json" for arm in ("untuned", "tuned")]
    serve, _, _ = frames.load_tables(files, results)
    return serve


def main() -> None:
    n, pcts = int(sys.argv[1]), [float(x) for x in sys.argv[2].split(",")]
    osl, repeats, prompts = (int(x) for x in sys.argv[3:6])
    for _ in range(n):
        for pct in pcts:
            with tempfile.TemporaryDirectory() as d:
                t0 = time.time()
                serve = measure(Path(d), pct, osl, repeats, prompts)
                a, b = serve[serve.arm == "untuned"], serve[serve.arm == "tuned"]
                rows = comparison.compare_serve(a, b, min_change_pct=2.0)
                r = next(r for r in rows if r["metric"] == "mean_tpot_ms")
                load = Path("/proc/loadavg").read_text().split()[0]
                print(
                    f"RESULT osl={osl} rep={repeats} pr={prompts} pct={pct} "
                    f"change={r['change_pct']:.3f} ci=[{r['ci_low']:.2f},{r['ci_high']:.2f}] "
                    f"p={r['p']:.3g} p_adj={r['p_adj']:.3g} "
                    f"verdict={r['verdict'].replace(' ', '_')} "
                    f"untuned={[round(x, 2) for x in a.mean_tpot_ms]} "
                    f"tuned={[round(x, 2) for x in b.mean_tpot_ms]} "
                    f"load={load} wall={time.time() - t0:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
