"""Does cellbench's load generator measure a vLLM server as `vllm bench serve` does? (rerunnable)

One vLLM server in a container of the rehearsal image (config/rehearsal.yaml's, pinned by
digest), serving the embedded default's tiny model. Against it, interleaved per repeat and
concurrency (ours then vLLM's, then vLLM's then ours, ...): cellbench's load generator
(``cellbench.serve.loadgen``, the serve stage's client) and `vllm bench serve` run inside a second
container of the same image (host network), both on the same prompts (the load generator's
prompts for that seed, given to vLLM's client as a custom JSONL dataset with no chat template
and no shuffling), the same output length (ignore_eos), temperature 0 and request rate inf.

Per concurrency: the median over repeats of each metric's ratio ours / vLLM's (mean TTFT,
TPOT, ITL, E2EL and output throughput), with the ratios' min and max: the spread. Writes a
Markdown table and the raw per-repeat figures as JSON.

    .venv/bin/python benchmarks/peer_vllm_bench_serve.py --image REPO@sha256:... \
        --model results/assets/models/tiny-qwen3-moe --out-dir benchmarks/results/peer_...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from cellbench.runtime import container
from cellbench.serve import loadgen, random_prompts
from cellbench.serve.server import CONTAINER_MODEL_DIR, ServerSpec, observe_version, serve

METRICS = ("ttft", "tpot", "itl", "e2el")


def vllm_bench(
    image: str,
    port: int,
    model_id: str,
    model_dir: Path,
    data_dir: Path,
    n: int,
    conc: int,
    osl: int,
    warmups: int,
    log: Path,
) -> dict:
    """One `vllm bench serve` run inside the image; its saved result JSON."""
    cmd = [
        "vllm",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--endpoint",
        "/v1/completions",
        "--model",
        model_id,
        "--tokenizer",
        CONTAINER_MODEL_DIR,
        "--dataset-name",
        "custom",
        "--dataset-path",
        "/data/prompts.jsonl",
        "--skip-chat-template",
        "--disable-shuffle",
        "--custom-output-len",
        str(osl),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(warmups),
        "--ignore-eos",
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        "/data",
        "--result-filename",
        "result.json",
    ]
    (data_dir / "result.json").unlink(missing_ok=True)
    container.run_step(
        image,
        cmd,
        mounts=[
            container.Mount(str(model_dir.resolve()), CONTAINER_MODEL_DIR, read_only=True),
            container.Mount(str(data_dir.resolve()), "/data", read_only=False),
        ],
        log_path=log,
        network_mode="host",
    )
    return json.loads((data_dir / "result.json").read_text())


def ours(
    base: str, model_id: str, tok, n: int, conc: int, isl: int, osl: int, seed: int, warmups: int
) -> dict:
    spec = loadgen.PointSpec(
        isl=isl, osl=osl, max_concurrency=conc, num_prompts=n, num_warmups=warmups, seed=seed
    )
    return loadgen.run_point(base, model_id, tok, spec, ignore_eos=True, backend="vllm")


def figures(result: dict) -> dict[str, float]:
    out = {m: float(result[f"mean_{m}_ms"]) for m in METRICS}
    out["output_throughput"] = float(result["output_throughput"])
    out["completed"] = float(result["completed"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="pinned image, repo@sha256:...")
    ap.add_argument("--model", required=True, type=Path, help="a local model folder")
    ap.add_argument("--isl", type=int, default=32)
    ap.add_argument("--osl", type=int, default=16)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--prompts-per-concurrency", type=int, default=4)
    ap.add_argument("--warmups", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8190)
    ap.add_argument(
        "--dtype",
        default="fp16",
        help="the model dtype served (as the rehearsal's config says; vLLM's CPU bf16 worker "
        "dies with SIGILL on some AMX hosts)",
    )
    ap.add_argument(
        "--serve-args",
        default="--enforce-eager",
        help="extra `vllm serve` arguments, space-separated (as config/rehearsal.yaml's)",
    )
    ap.add_argument("--out-dir", required=True, type=Path)
    a = ap.parse_args(argv)
    if "@sha256:" not in a.image:
        ap.error(f"--image {a.image!r}: expected a pinned reference repo@sha256:...")
    if not (a.model / "config.json").is_file():
        ap.error(
            f"--model {a.model}: no config.json there (build it: snakemake "
            "results/assets/models/tiny-qwen3-moe --configfile config/rehearsal.yaml)"
        )
    levels = [int(x) for x in a.concurrency.split(",")]
    a.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        tmp = Path(tmp)
        spec = ServerSpec(
            runtime="docker",
            model=str(a.model),
            port=a.port,
            log_path=tmp / "server.log",
            image_ref=a.image,
            ready_timeout_s=600,
            gpu_vendor="none",
            server="vllm",
            dtype=a.dtype,
            serve_args=a.serve_args.split(),
        )
        t0 = time.monotonic()
        with serve(spec) as server:
            print(f"server ready in {time.monotonic() - t0:.0f} s", file=sys.stderr)
            tok = random_prompts.load_tokenizer(str(a.model), server.base_url, server.model_id)
            for rep in range(a.repeats):
                for conc in levels:
                    n = a.prompts_per_concurrency * conc
                    seed = 1000 * rep + conc
                    prompts = random_prompts.make_prompts(tok, n, a.isl, seed=seed)
                    (tmp / "prompts.jsonl").write_text(
                        "".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts)
                    )
                    order = ["ours", "vllm"] if rep % 2 == 0 else ["vllm", "ours"]
                    got = {}
                    for who in order:
                        if who == "ours":
                            got[who] = figures(
                                ours(
                                    server.base_url,
                                    server.model_id,
                                    tok,
                                    n,
                                    conc,
                                    a.isl,
                                    a.osl,
                                    seed,
                                    a.warmups,
                                )
                            )
                        else:
                            got[who] = figures(
                                vllm_bench(
                                    a.image,
                                    a.port,
                                    server.model_id,
                                    a.model,
                                    tmp,
                                    n,
                                    conc,
                                    a.osl,
                                    a.warmups,
                                    a.out_dir / "vllm-bench.log",
                                )
                            )
                    rows.append(
                        {
                            "repeat": rep,
                            "concurrency": conc,
                            "prompts": n,
                            "order": order,
                            **{k: got[k] for k in order},
                        }
                    )
                    print(
                        f"repeat {rep} c={conc}: ours {got['ours']} vllm {got['vllm']}",
                        file=sys.stderr,
                    )
            version = observe_version(server.base_url)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "image": a.image,
        "isl": a.isl,
        "osl": a.osl,
        "repeats": a.repeats,
        "warmups": a.warmups,
        "prompts_per_concurrency": a.prompts_per_concurrency,
        "command": " ".join(sys.argv),
    }
    (a.out_dir / "peer.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# cellbench's load generator vs `vllm bench serve`, same server, same prompts",
        "",
        f"Image `{a.image}`; ISL {a.isl}, OSL {a.osl} (ignore_eos), temperature 0, rate inf; "
        f"{a.repeats} interleaved repeats per concurrency; {a.prompts_per_concurrency} prompts "
        f"per unit of concurrency, {a.warmups} warm-up(s). Ratio = ours / vLLM's, median over "
        "repeats [min, max] (means per run).",
        "",
        "| concurrency | "
        + " | ".join(f"{m.upper()}" for m in METRICS)
        + " | output tok/s | completed (ours / vLLM) |",
        "|---|" + "---|" * (len(METRICS) + 2),
    ]
    for conc in levels:
        mine = [r for r in rows if r["concurrency"] == conc]
        cells = []
        for m in (*METRICS, "output_throughput"):
            ratios = [r["ours"][m] / r["vllm"][m] for r in mine if r["vllm"][m] > 0]
            cells.append(
                f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
                if ratios
                else "n/a"
            )
        done = (
            f"{sum(r['ours']['completed'] for r in mine):.0f} / "
            f"{sum(r['vllm']['completed'] for r in mine):.0f}"
        )
        lines.append(f"| {conc} | " + " | ".join(cells) + f" | {done} |")
    lines += [
        "",
        f"Server: vLLM {version.get('version')} (its answer to GET /version).",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
    (a.out_dir / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
