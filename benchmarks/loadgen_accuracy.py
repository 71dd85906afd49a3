"""How exactly does the load generator measure, and what does it cost? (rerunnable)

Drives ``cellbench.serve.loadgen`` against the timed server (``cellbench.serve.timed_server``, a
subprocess) at several concurrencies and compares each metric with the truth the server records
on the host's shared monotonic clock:

* TTFT truth = server's first-token write - client's request start;
* E2EL truth = server's last-token write - client's request start;
* TPOT truth = (last write - first write) / (tokens - 1); ITL truth = mean gap between writes.

So an error is how late the client noticed chunks. Also printed: the server's own lateness
against its configured TTFT/ITL, the dispatch delay (server receipt - client start: queueing in
the client and the server's accept loop, counted inside true TTFT as vllm bench serve counts it),
and the client's CPU time per request and in cores.

    python benchmarks/loadgen_accuracy.py [--levels 1,64,256,512] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import UTC, datetime

import numpy as np
import requests
from cellbench.serve import loadgen, random_prompts, sse_client
from cellbench.serve.timed_server import launch


def _truth(base: str, res: list[sse_client.RequestResult]) -> dict[str, float]:
    stats = requests.get(f"{base}/stats", timeout=30).json()["requests"]
    ok = [r for r in res if r.success]
    ss = [stats[r.response_id] for r in ok]
    gaps_total = sum(s["last"] - s["first"] for s in ss)
    n_gaps = sum(s["n"] - 1 for s in ss)
    return {
        "ttft": float(np.mean([(s["first"] - r.start) for s, r in zip(ss, ok, strict=True)])) * 1e3,
        "e2el": float(np.mean([(s["last"] - r.start) for s, r in zip(ss, ok, strict=True)])) * 1e3,
        "tpot": float(np.mean([(s["last"] - s["first"]) / (s["n"] - 1) for s in ss])) * 1e3,
        "itl": gaps_total / n_gaps * 1e3,
        "srv_ttft": float(np.mean([s["ttft_ms"] for s in ss])),
        "dispatch": float(np.mean([(s["recv"] - r.start) for s, r in zip(ss, ok, strict=True)]))
        * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--levels", default="1,64,256,512")
    p.add_argument("--ttft-ms", type=float, default=200.0)
    p.add_argument("--itl-ms", type=float, default=50.0)
    p.add_argument("--isl", type=int, default=16)
    p.add_argument("--osl", type=int, default=16)
    p.add_argument("--prompts-per-concurrency", type=int, default=4)
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--out", default=None, help="also write the report here")
    a = p.parse_args(argv)
    levels = [int(x) for x in a.levels.split(",")]
    lines = [
        f"# loadgen accuracy, {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"# host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, load avg {os.getloadavg()[0]:.2f} at start",
        f"# timed server: ttft {a.ttft_ms} ms, itl {a.itl_ms} ms, isl {a.isl}, osl {a.osl} "
        "(ignore_eos), server and client share the 2 CPUs",
        "# err = measured mean - true mean (server's writes on the shared monotonic clock)",
        "",
        f"{'conc':>5} {'prompts':>7} | {'ttft ms':>8} {'err%':>6} | {'tpot ms':>7} {'err%':>6} "
        f"| {'itl ms':>7} {'err%':>6} | {'e2el ms':>8} {'err%':>6} | {'srv late ttft':>13} "
        f"{'dispatch':>8} | {'cpu ms/req':>10} {'cpu cores':>9}",
    ]
    print("\n".join(lines), flush=True)
    with launch("--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms)) as (base, _):
        tok = random_prompts.ServerTokenizer(base, "timed-model")
        for c in levels:
            n = max(a.min_prompts, a.prompts_per_concurrency * c)
            spec = loadgen.PointSpec(
                isl=a.isl, osl=a.osl, max_concurrency=c, num_prompts=n, num_warmups=c
            )
            pt = loadgen.run_point(
                base, "timed-model", tok, spec, ignore_eos=True, keep_results=True
            )
            t = _truth(base, pt["_results"])

            def err(m: str, t: dict[str, float] = t, pt: dict = pt) -> str:
                return f"{pt[f'mean_{m}_ms']:8.2f} {100 * (pt[f'mean_{m}_ms'] - t[m]) / t[m]:+6.2f}"

            row = (
                f"{c:>5} {n:>7} | {err('ttft')} | {err('tpot')[1:]} | {err('itl')[1:]} | "
                f"{err('e2el')} | {t['srv_ttft'] - a.ttft_ms:+13.2f} {t['dispatch']:8.2f} | "
                f"{pt['client_cpu_ms_per_request']:10.3f} {pt['client_cpu_util']:9.3f}"
            )
            if pt["failed"]:
                row += f"  ({pt['failed']} failed: {pt['errors'][:1]})"
            print(row, flush=True)
            lines.append(row)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
