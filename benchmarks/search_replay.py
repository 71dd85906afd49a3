"""Default mode's search replayed on the timings an exhaustive run recorded: no GPU needed.

An exhaustive tuning log (benchmarks/results/*_log-exhaustive.jsonl[.gz]) holds, for every
batch size, the timing samples of every config of the space that survived pruning. Here the
real `Tuner` runs in default mode with its GPU options (round 0, local search, halving,
side-by-side final, warm starts, compile budgets, the shipped configs as seeds), but each
timing it asks for is answered from that record: `repeats` samples drawn with replacement
from the recorded samples (seeded), their median. A config the exhaustive run did not time
counts as failed.

Per batch size it prints, over --seeds seeds (each its own candidate order and draws): the
recorded median of default's pick over the best recorded median (median and worst ratio),
the timings and the new compiles the search spent (compiles are what cost wall time on the
GPU), and how many timings the exhaustive run took.

What this measures: whether the search reaches the best configs of a real landscape, and at
what cost in timings and compiles. What it does not: GPU time, or noise as a GPU run meets
it. The recorded medians carry the exhaustive run's own noise (a sequential screen: up to
3 % drift at M=4096 on the H200), so ratios within about 1-2 % are not told apart; only a
GPU run (benchmarks/tuner_default_mode_cost.py) can say which of two near-equal configs is faster.

    PYTHONPATH=workflow python benchmarks/search_replay.py \\
        benchmarks/results/tuner_h200_2026-12-03_bf16-6ms-both_run15_log-exhaustive.jsonl.gz
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import json
import random
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))
from cellbench.tune import (  # noqa: E402
    kernels,  # noqa: E402
    spaces,  # noqa: E402
)
from cellbench.tune.artifacts import TuningLog  # noqa: E402
from cellbench.tune.backends import BuiltinBackend, VllmBackend  # noqa: E402
from cellbench.tune.candidates import CandidateSteps  # noqa: E402
from cellbench.tune.final_pick import FinalPick  # noqa: E402
from cellbench.tune.search import TuneOptions, build_tuner  # noqa: E402
from cellbench.tune.shapes import MoEShape  # noqa: E402
from cellbench.tune.timing import Timing  # noqa: E402

CONFIG_DIR = ROOT / "tests" / "data" / "vllm-configs"
SHAPES = {  # Qwen3-30B-A3B at TP=1, as benchmarks/tuner_default_mode_cost.py tunes it
    "bf16": MoEShape(128, 768, 2048, 8),
    "fp8": MoEShape(128, 768, 2048, 8, "fp8_w8a8", (128, 128)),
}
H200 = spaces.HardwareLimits(spaces.H200_SMEM_BYTES, "cuda", "3.6.0")
REPLAY_METHOD = "replay-of-recorded-samples"


@contextlib.contextmanager
def _kernel_rules_as_on_cuda(persistent: bool) -> Iterator[None]:
    """The kernel path rule as on a CUDA GPU, for the duration (under the interpreter the
    few-token path is off, which would change what the search sees at M <= 4); persistent
    GEMMs as the module's rule has them, or off for logs recorded before that rule (runs
    15-16): they decide which batch sizes share compiled kernels."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    before = policy.DECODE_MAX_TOKENS, policy.PERSISTENT_GEMMS
    policy.DECODE_MAX_TOKENS = policy.DECODE_RULE_MAX_TOKENS
    if not persistent:
        policy.PERSISTENT_GEMMS = ()
    try:
        yield
    finally:
        policy.DECODE_MAX_TOKENS, policy.PERSISTENT_GEMMS = before


class ReplayBackend(BuiltinBackend):
    """The builtin backend's rules (kernel path, identity, M-dependent specialisation) for a
    shape, without weights: nothing is run."""

    def __init__(self, shape: MoEShape):  # no super().__init__: no weights are made
        self._k = kernels
        self.shape = shape
        self.base = SimpleNamespace(quant=object() if shape.dtype else None)
        self.error_bound = float("inf")

    def make_problem(self, m: int, seed: int) -> Any:
        return SimpleNamespace(m=m, quant=self.base.quant)

    def reference(self, problem: Any) -> None:
        return None


class VllmReplayBackend(ReplayBackend):
    """vLLM's kernel's rules as `VllmBackend` has them when it runs from vLLM's sources (one
    path, every config its own kernel, the few-token rule its only M-dependent choice)."""

    name = "vllm"
    _source = "recorded"  # the rules of the kernel run from vLLM's sources
    kernel_path = VllmBackend.kernel_path
    m_specialisation = VllmBackend.m_specialisation
    kernel_identity = VllmBackend.kernel_identity


REPLAY_BACKENDS = {"builtin": ReplayBackend, "vllm": VllmReplayBackend}


class ReplayCandidates(CandidateSteps):
    """Candidate steps whose timings are drawn from recorded samples (see the module
    docstring)."""

    def __init__(self, ctx: Any, space: Any, *, recorded: dict[tuple[int, str], list[float]]):
        super().__init__(ctx, space)
        self.recorded = recorded
        self.rng = random.Random(ctx.opt.seed)

    def draw(self, m: int, cfg: dict[str, int], n: int) -> Timing | None:
        samples = self.recorded.get((m, self.ctx.backend.kernel_identity(m, cfg)))
        if not samples:
            return None
        draw = [self.rng.choice(samples) for _ in range(n)]
        return Timing(statistics.median(draw), draw, REPLAY_METHOD)

    def check(self, m, cfg, key, problems, ref):
        self.ctx.ledger.note(m, key)
        if self.draw(m, cfg, 1) is None:
            self.fail(m, cfg, key, "check", "not timed by the recorded exhaustive run")
            return False, None
        return True, 0.0

    def time(self, m, cfg, key, stage, problems, repeats, abandon_above_us):
        self.ctx.ledger.note(m, key)
        t = self.draw(m, cfg, repeats)
        if t is None:
            self.fail(m, cfg, key, stage, "not timed by the recorded exhaustive run")
            return None
        if abandon_above_us is not None and t.samples_us[0] > abandon_above_us:
            t = Timing(t.samples_us[0], t.samples_us[:1], REPLAY_METHOD, abandoned=True)
        self.record_timed(m, key, cfg, stage, t)
        return t


class ReplayFinal(FinalPick):
    """The final pick, its side-by-side timings drawn from the recorded samples too."""

    steps: ReplayCandidates

    def side_by_side(self, m, configs, problems, repeats, stage):
        out = []
        for key, cfg in configs:
            t = self.steps.draw(m, cfg, repeats)
            assert t is not None, f"{stage} config {key} at M={m} has no recorded samples"
            self.steps.record_timed(m, key, cfg, stage, t)
            out.append((key, cfg, t))
        return out


def read_records(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def recorded_samples(
    records: list[dict[str, Any]], backend: ReplayBackend
) -> dict[tuple[int, str], list[float]]:
    """(M, kernel identity) -> the exhaustive screen's samples (its final's, where it has
    none). By identity, not config key: where a path ignores some keys (the few-token path),
    which config stands for a kernel depends on the candidate order, i.e. on the seed."""
    out: dict[tuple[int, str], list[float]] = {}
    for stage in ("exhaustive", "screen-all", "final"):
        for r in records:
            if r.get("stage") == stage and r.get("status") == "timed":
                ident = backend.kernel_identity(int(r["m"]), r["config"])
                out.setdefault((int(r["m"]), ident), list(r.get("samples_us") or [r["time_us"]]))
    return out


def exhaustive_timed(records: list[dict[str, Any]]) -> dict[int, int]:
    """Per M: timings the exhaustive run took (its screen and its final)."""
    timed: dict[int, int] = defaultdict(int)
    for r in records:
        if r.get("status") == "timed":
            timed[int(r["m"])] += 1
    return dict(timed)


def replay(
    dtype: str, recorded: dict, ms: list[int], seed: int, backend: str = "builtin", **options: Any
) -> dict[int, dict[str, Any]]:
    shape = SHAPES[dtype]
    table_file = CONFIG_DIR / shape.config_file_name("NVIDIA_H200")
    table = {int(k): v for k, v in json.loads(table_file.read_text()).items() if k.isdigit()}
    opts = TuneOptions(mode="default", seed=seed, on_gpu=True, seed_table=table, **options)
    with tempfile.TemporaryDirectory() as tmp:
        tuner = build_tuner(
            REPLAY_BACKENDS[backend](shape),
            spaces.cuda_space(shape.block_shape),
            n=shape.intermediate_size,
            k=shape.hidden_size,
            operand_bytes=1 if shape.dtype else 2,
            limits=H200,
            options=opts,
            log=TuningLog(Path(tmp) / "log.jsonl"),
            progress=lambda s: None,
            candidate_steps=functools.partial(ReplayCandidates, recorded=recorded),
            final_pick=ReplayFinal,
        )
        out = {}
        for m in ms:
            n0 = tuner.stats.timed
            e = tuner.tune_one(m)
            out[m] = {
                "ident": tuner.ctx.backend.kernel_identity(m, e.config),
                "name": spaces.describe(e.config),
                "timed": tuner.stats.timed - n0,
                "new": e.new_compiles,
            }
    return out


def evaluate(
    path: Path,
    seeds: int,
    dtype: str | None = None,
    persistent: bool = False,
    backend: str = "builtin",
    ms: list[int] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Replay default mode `seeds` times on the exhaustive log at `path`; one row per M.
    `persistent`: the log was recorded with persistent GEMMs (kernel rule of commit 450047a
    on); `backend`: whose kernel recorded it ('builtin' or 'vllm'); `ms`: the batch sizes
    listed (default: every one recorded; a list of fewer shows what sparse lists do);
    `options` override TuneOptions fields (e.g. compile_budget=(16, 4))."""
    dtype = dtype or ("fp8" if "fp8" in path.name else "bf16")
    records = read_records(path)
    with _kernel_rules_as_on_cuda(persistent):
        recorded = recorded_samples(records, REPLAY_BACKENDS[backend](SHAPES[dtype]))
        have = sorted({m for m, _ in recorded})
        if ms is not None and not set(ms) <= set(have):
            raise ValueError(f"batch sizes {sorted(set(ms) - set(have))} are not in {path.name}")
        ms = sorted(ms) if ms is not None else have
        runs = [replay(dtype, recorded, ms, seed, backend, **options) for seed in range(seeds)]
    med = {mk: statistics.median(s) for mk, s in recorded.items()}
    best = {m: min(t for (mm, _), t in med.items() if mm == m) for m in ms}
    exh = exhaustive_timed(records)
    rows = []
    for m in ms:
        picks: dict[str, int] = defaultdict(int)
        for r in runs:
            picks[r[m]["name"]] += 1
        rows.append({
            "M": m,
            "best_us": best[m],
            "ratios": [med[m, r[m]["ident"]] / best[m] for r in runs],
            "picks": dict(picks),
            "timed_median": statistics.median(r[m]["timed"] for r in runs),
            "new_median": statistics.median(r[m]["new"] for r in runs),
            "exhaustive_timed": exh[m],
        })  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="an exhaustive tuning log (.jsonl or .jsonl.gz)")
    ap.add_argument("--dtype", choices=sorted(SHAPES), help="default: from the file name")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--compile-budget", help="FIRST,LATER new kernels per batch size")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--backend", choices=sorted(REPLAY_BACKENDS), default="builtin",
                    help="whose kernel recorded the log (default builtin)")  # fmt: skip
    ap.add_argument(
        "--lists",
        help="batch-size lists to replay, ';' between lists (e.g. '1,16,4096;4096'); "
        "default: every recorded batch size as one list",
    )
    ap.add_argument(
        "--persistent",
        action="store_true",
        help="the log was recorded with persistent GEMMs at large M (run 19 on)",
    )
    args = ap.parse_args()
    path = Path(args.log)
    options = {}
    if args.compile_budget:
        first, later = (int(x) for x in args.compile_budget.split(","))
        options["compile_budget"] = (first, later)
    try:
        lists = [
            [int(x) for x in part.split(",")] for part in args.lists.split(";") if part.strip()
        ] if args.lists else [None]  # fmt: skip
    except ValueError:
        ap.error(f"--lists={args.lists!r}: expected comma lists of integers, ';' between lists")
    print(f"# search replay: {path.name}, {args.seeds} seeds; timings are draws from recorded "
          "samples, not GPU runs")  # fmt: skip
    out = []
    for ms in lists:
        try:
            rows = evaluate(path, args.seeds, args.dtype, args.persistent, args.backend, ms,
                            **options)  # fmt: skip
        except ValueError as e:
            ap.error(f"--lists: {e}")
        print(f"list {','.join(str(r['M']) for r in rows)}")
        print(f"{'M':>6} {'best us':>9} {'ratio med':>9} {'worst':>7} {'timed':>6} {'new':>5} "
              f"{'exh timed':>9}  most frequent pick")  # fmt: skip
        for r in rows:
            top = max(r["picks"], key=r["picks"].get)
            med, worst = statistics.median(r["ratios"]), max(r["ratios"])
            print(
                f"{r['M']:>6} {r['best_us']:>9.2f} {med:>9.4f} {worst:>7.4f} "
                f"{r['timed_median']:>6.0f} {r['new_median']:>5.0f} "
                f"{r['exhaustive_timed']:>9}  {top} ({r['picks'][top]}/{args.seeds})"
            )
        out.append({"list": [r["M"] for r in rows], "rows": rows})
    if args.json:
        Path(args.json).write_text(json.dumps({"log": path.name, "lists": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
