"""Figures in README.md, docs/*.md and benchmarks/**/*.md, each traced to a committed file.

A figure here is a number with a unit of time, share or size (`41 min`, `1359 s`, `56.4 %`,
`3.5 GB`) or a test count (`3 passed`). Each one a scanned page shows must be either

* a headline figure that `headline_figures.py` recomputes from its file (any page may quote
  one), or
* inside the quote of a CLAIMS row: the page holds the quote verbatim, and the row's source
  file (in the tree, or at the commit the row names) holds the row's evidence verbatim, which
  a reader compares with the quote (`1359 s` against the log's `1719.96s`, and so on), or
* on a page of UNTRACED, which says how many of its figures are not traced one by one yet and
  why; the count must be exact, so it can only go down as figures get rows or are removed.

Pages written by a script (its output is the source) are not scanned: GENERATED.

    python3 benchmarks/doc_figures.py            # every claim and every untraced figure
    python3 benchmarks/doc_figures.py --check    # exit 1 on a broken claim or an untraced figure
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import headline_figures  # noqa: E402

UNIT = r"(?:s|min|ms|us|µs|%|GB|GiB|MB|MiB|h|minutes?|seconds?|hours?)"
NUMBER = r"\d+(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.\-]){NUMBER}(?:\s?-\s?{NUMBER})?\s?{UNIT}(?![\w/\-])"
    rf"|(?<![\w.])\d+ (?:passed|failed|skipped|errors?|xfailed)\b"
)


def scanned_pages() -> list[str]:
    pages = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
    listed = subprocess.run(
        ["git", "ls-files", "benchmarks/*.md", "benchmarks/**/*.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return pages + sorted(set(listed))


# Pages a script writes: the page is the output, its figures are the source.
GENERATED = {
    "docs/bad-input.md": "rendered from tests/support/bad_input_*.py's PROBES (config values, "
    "not measurements)",
}
GENERATED_PATTERNS = (
    re.compile(r"benchmarks/results/.*/report\.md"),  # the pipeline's report of that run
    re.compile(r"benchmarks/results/[a-z_]+_\d{4}-\d{2}-\d{2}\.md"),  # a script's table
)


@dataclass(frozen=True)
class Claim:
    page: str  # where the figure is quoted
    quote: str  # the words around it, verbatim (line breaks do not count)
    source: str  # a committed file, repository path
    evidence: str  # verbatim in that file
    commit: str = ""  # read the source at this commit (a file that left the tree)


HISTORY = headline_figures.HISTORY
SLURM = "benchmarks/results/slurm_2026-12-04"
SLURM6 = "benchmarks/results/slurm_2026-12-06"
EMBEDDED_NOW = "benchmarks/results/embedded_default_time_2026-12-06_gsm8k_both_arms.txt"
EMBEDDED_BEFORE_BOTH_ARMS = (
    "benchmarks/results/embedded_default_time_2026-12-06_before_gsm8k_both_arms.txt"
)
EMBEDDED_WAVE19 = "benchmarks/results/embedded_default_time_2026-12-04_wave19.txt"
GPU_TESTS = "benchmarks/results/gpu_tests_h100_2026-12-06"
I33 = "benchmarks/results/issue33_h100_2026-12-05"
WAVE19_TAR = "benchmarks/results/gpu_local_h200_2026-12-04_wave19/results.tar.gz"
W19_BENCH = "results/benchmarks"
W19_CELL = "host-cuda/small-qwen3-moe/tp1-ep1"
RES = "benchmarks/results"
DESIGN_TILES = "M=4096's GEMMs 56 % of the matmul ceiling against 51 % with one tile per program"
DESIGN_RUN25 = (
    "fp8 default took 25.9 s of wall and 12.0 GPU-seconds with them, against 27.8 s and 17.6 "
    "without"
)

CLAIMS: list[Claim] = [
    Claim(
        "README.md",
        "at 6364327 took 11 min 27 s",
        "benchmarks/results/embedded_default_time_2026-12-06_sequential_idle.txt",
        "Elapsed (wall clock) time (h:mm:ss or m:ss): 11:26.80",
    ),
    Claim(
        "docs/testing.md",
        '"1 failed, 249 passed, 12 skipped"',
        f"{GPU_TESTS}/issue33_fix_gpu_tests.txt.gz",
        "1 failed, 249 passed, 12 skipped in 166.71s (0:02:46)",
    ),
    Claim(
        f"{GPU_TESTS}/README.md",
        "1 failed, 249 passed, 12 skipped in 166.71s (0:02:46)",
        f"{GPU_TESTS}/issue33_fix_gpu_tests.txt.gz",
        "1 failed, 249 passed, 12 skipped in 166.71s (0:02:46)",
    ),
    # benchmarks/results/issue33_h100_2026-12-05/README.md: bf16 group B, calls 3 and 4
    Claim(
        f"{I33}/README.md",
        "default 28.0 s / exhaustive 279.2 s (process walls)",
        f"{I33}/tuner_vllm_kernel_h100_bf16_M512-1536.txt",
        "at M=512,1536: default 28.0 s / exhaustive 279.2 s = 0.100",
    ),
    Claim(
        f"{I33}/README.md",
        "per-M tuning walls 13.7 / 261.3 s",
        f"{I33}/tuner_vllm_kernel_h100_bf16_M512-1536.txt",
        "tuning wall at M=512,1536: default 13.7 s / exhaustive 261.3 s",
    ),
    Claim(
        f"{I33}/README.md",
        "default 22.2 s / exhaustive 150.2 s",
        f"{I33}/tuner_vllm_kernel_h100_bf16_M4096.txt",
        "at M=4096: default 22.2 s / exhaustive 150.2 s = 0.148",
    ),
    Claim(
        f"{I33}/README.md",
        "per-M tuning walls 8.2 / 135.2 s",
        f"{I33}/tuner_vllm_kernel_h100_bf16_M4096.txt",
        "tuning wall at M=4096: default 8.2 s / exhaustive 135.2 s",
    ),
    # README.md
    Claim(
        "README.md",
        "took 7 min 17 s on an idle 2-core VM at commit 370dfab",
        EMBEDDED_NOW,
        "Elapsed (wall clock) time (h:mm:ss or m:ss): 7:16.81",
    ),
    Claim(
        "README.md",
        "7 min 20 s on this one at b053a2d",
        EMBEDDED_BEFORE_BOTH_ARMS,
        "Elapsed (wall clock) time (h:mm:ss or m:ss): 7:19.96",
    ),
    Claim(
        "README.md",
        'their committed full run ended "15 passed", the scancel test included',
        f"{SLURM6}/pytest_full_run.log",
        "PASSED tests/integration/test_slurm.py::test_scancel_mid_benchmark_then_the_rerun_redoes_"
        "only_that_job",
    ),
    Claim(
        "README.md",
        'their committed full run ended "15 passed"',
        f"{SLURM6}/pytest_full_run.log",
        "= 15 passed in 2982.67s (0:49:42) =",
    ),
    # benchmarks/results/slurm_2026-12-06/NOTES.md: the run's own log
    Claim(
        f"{SLURM6}/NOTES.md",
        '"15 passed in 2982.67s (0:49:42)"',
        f"{SLURM6}/pytest_full_run.log",
        "= 15 passed in 2982.67s (0:49:42) =",
    ),
    Claim(
        f"{SLURM6}/NOTES.md",
        "`profiles/slurm` took 1740 s inside it",
        f"{SLURM6}/pytest_full_run.log",
        "[test_slurm] embedded default through Slurm: 1740 s",
    ),
    Claim(
        f"{SLURM6}/NOTES.md",
        "that one job) took 1201 s",
        f"{SLURM6}/pytest_full_run.log",
        "[test_slurm] scancel + rerun: 1201 s wall",
    ),
    Claim(
        f"{SLURM6}/NOTES.md",
        '`slurm_2026-12-04/`\'s "1 failed, 3 passed"',
        f"{SLURM}/pytest_full_run.log",
        "= 1 failed, 3 passed in 1719.96s (0:28:39) =",
    ),
    # docs/testing.md
    Claim(
        "docs/testing.md",
        'ended "15 passed in 2982.67s (0:49:42)"',
        f"{SLURM6}/pytest_full_run.log",
        "= 15 passed in 2982.67s (0:49:42) =",
    ),
    Claim(
        "docs/testing.md",
        "the embedded default through Slurm inside it took 1740 s",
        f"{SLURM6}/pytest_full_run.log",
        "[test_slurm] embedded default through Slurm: 1740 s wall",
    ),
    Claim(
        "docs/testing.md",
        "the scancel test 1201 s",
        f"{SLURM6}/pytest_full_run.log",
        "[test_slurm] scancel + rerun: 1201 s wall",
    ),
    Claim(
        "docs/testing.md",
        '(`slurm_2026-12-04/`) ended "1 failed, 3 passed"',
        f"{SLURM}/pytest_full_run.log",
        "= 1 failed, 3 passed in 1719.96s (0:28:39) =",
    ),
    Claim(
        "docs/testing.md",
        "179 passed and 4 skipped",
        f"{GPU_TESTS}/README.md",
        "179 passed, 4 skipped",
    ),
    Claim(
        "docs/testing.md",
        "(their committed run took 2982.67 s, below)",
        f"{SLURM6}/pytest_full_run.log",
        "in 2982.67s (0:49:42)",
    ),
    # docs/cluster.md: the H200 run's per-rule benchmark files, and the Slurm run
    Claim(
        "docs/cluster.md",
        "tune 64.45 s",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/tune.tsv",
        "64.45 0:01:04",
    ),
    Claim(
        "docs/cluster.md",
        "serve pair 362.25 s",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/serve-pair.tsv",
        "362.25 0:06:02",
    ),
    Claim(
        "docs/cluster.md",
        "everything else of the cell under 3 s (GSM8K 0.3 s, gate 1.8 s",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/gate.tsv",
        "1.81 0:00:01",
    ),
    Claim(
        "docs/cluster.md",
        "(GSM8K 0.3 s",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/gsm8k-untuned.tsv",
        "0.31 0:00:00",
    ),
    Claim(
        "docs/cluster.md",
        "the report and archive run once per run, about 6 s",
        f"{WAVE19_TAR}::{W19_BENCH}/report.tsv",
        "3.02 0:00:03",
    ),
    Claim(
        "docs/cluster.md",
        "the report and archive run once per run, about 6 s",
        f"{WAVE19_TAR}::{W19_BENCH}/archive-h200-local.tsv",
        "3.31 0:00:03",
    ),
    Claim(
        "docs/cluster.md",
        "64.45 s x tp + 362.25 s x 2 tp = 788.95 GPU-seconds x tp",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/serve-pair.tsv",
        "362.25 0:06:02",
    ),
    Claim(
        "docs/cluster.md",
        "(at least 64 + 362 s here)",
        f"{WAVE19_TAR}::{W19_BENCH}/{W19_CELL}/serve-pair.tsv",
        "362.25 0:06:02",
    ),
    Claim(
        "docs/cluster.md",
        "took 22 min 39 s through Slurm on 2026-12-04",
        f"{SLURM}/pytest_full_run.log",
        "[test_slurm] embedded default through Slurm: 1359 s",
    ),
    Claim(
        "docs/cluster.md",
        "against 11 min 2 s locally on the idle machine",
        EMBEDDED_WAVE19,
        "Elapsed (wall clock) time (h:mm:ss or m:ss): 11:01.57",
    ),
    Claim(
        "docs/cluster.md",
        "`MinJobAge` (600 s on the test cluster",
        ".ci/slurm-up.sh",
        "MinJobAge=600",
    ),
    # docs/faults.md
    Claim(
        "docs/faults.md",
        "(the test allows 30 s;",
        "tests/workflow/test_faults.py",
        "assert stopped_s < 30",
    ),
    # docs/rehearsal.md
    Claim(
        "docs/rehearsal.md",
        "and the run (3 min 28 s) wrote the bump diff",
        "benchmarks/results/rehearsal_bump_2026-12-05/run-jobs.txt",
        "Elapsed time: 0:03:27.989028",
    ),
    # docs/usage.md: settings, each where the code sets it
    Claim(
        "docs/usage.md",
        "(default 10 %: the server-start spread",
        "workflow/schemas/config.schema.yaml",
        "default: 10.0",
    ),
    Claim(
        "docs/usage.md",
        "how many repeats a 5 % or 1 % change would need",
        "workflow/cellbench/stats/comparison.py",
        "for c in (5.0, 1.0)",
    ),
    Claim(
        "docs/usage.md",
        "its 95% interval from the repeats",
        "workflow/cellbench/stats/comparison.py",
        "The interval is the test's 95% interval of the change.",
    ),
    Claim(
        "docs/usage.md",
        "the number of repeats a 5% or 1% change would need",
        "workflow/cellbench/stats/comparison.py",
        "for c in (5.0, 1.0)",
    ),
    Claim(
        "docs/usage.md",
        "a 2 GiB KV cache",
        "workflow/cellbench/serve/server.py",
        'VLLM_CPU_KVCACHE_GIB = "2"',
    ),
    # docs/design.md (H200 runs 18, 22, 25, 26)
    Claim(
        "docs/design.md",
        DESIGN_TILES,
        f"{RES}/kernel_h200_2026-12-03_run18_persistent.txt",
        "one-tile gemms 768.6 (51.5%)",
    ),
    Claim(
        "docs/design.md",
        DESIGN_TILES,
        f"{RES}/kernel_h200_2026-12-03_run18_persistent.txt",
        "p12-flat gemms 706.8 (56.0%)",
    ),
    Claim(
        "docs/design.md",
        "ready 0.07 s after the pool is created, against 5.2-6.5 s for spawned ones",
        f"{RES}/compile_workers_h200_2026-12-03_run22.txt",
        "median last_ready: opens GPU 6.53 s, compile-only spawned 5.16 s, compile-only "
        "forked 0.07 s",
    ),
    Claim(
        "docs/design.md",
        DESIGN_RUN25,
        f"{RES}/tuner_h200_2026-12-03_fp8-6ms-both_run25.txt",
        "seconds: wall 25.9, cpu 144.9, gpu 12.0",
    ),
    Claim(
        "docs/design.md",
        DESIGN_RUN25,
        f"{RES}/tuner_h200_2026-12-03_fp8-6ms-default-noshared_run25.txt",
        "seconds: wall 27.8, cpu 119.9, gpu 17.6",
    ),
    Claim(
        "docs/design.md",
        "Default's setup (1.0 s) plus its GPU-seconds (12.4 s) already exceed 13 s",
        f"{RES}/tuner_h200_2026-12-03_fp8-6ms-both_run26.txt",
        "gpu 12.4 s; setup 1.0 s",
    ),
    # benchmarks/README.md, beside the figures headline_figures.py recomputes
    Claim(
        "benchmarks/README.md",
        "changes of 1-50% at 3-40 pairs",
        "benchmarks/verdict_error_rates.py",
        "EFFECTS = (1.0, 2.0, 5.0, 10.0, 30.0, 50.0)",
    ),
    Claim(
        "benchmarks/README.md",
        "changes of 1-50% at 3-40 pairs",
        "benchmarks/verdict_error_rates.py",
        "PAIRS = (3, 5, 10, 20, 40)",
    ),
    Claim(
        "benchmarks/README.md",
        "the committed run used 25 s, its `settings`",
        "benchmarks/results/telemetry_h200_2026-12-04.json",
        '"seconds": 25.0',
    ),
    Claim(
        "benchmarks/README.md",
        "# 7 min 17 s on 2 idle cores",
        EMBEDDED_NOW,
        "Elapsed (wall clock) time (h:mm:ss or m:ss): 7:16.81",
    ),
    Claim(
        "benchmarks/README.md",
        "of the 2 GiB read-rate floor",
        "benchmarks/gpu_ceilings.py",
        "# 2 GiB of float32",
    ),
    Claim(
        "benchmarks/README.md",
        "the rate one 75.5 MB torch read reaches",
        "benchmarks/results/kernel_h200_2026-12-02_run4.txt",
        "(a 75.5 MB read: 3007 GB/s)",
    ),
    Claim(
        "benchmarks/README.md",
        "inside that row's 2 % spread",
        "benchmarks/results/tuner_h200_2026-12-03_bf16-6ms-both_run20.txt",
        "789.29 1.003 - - 0.021",
    ),
]

# Pages whose figures are not traced one by one yet: page -> (untraced figures, why).
# Claims about the notebooks and the runs' notes live beside this file, one module per group of
# pages, as plain rows (page, quote, source, evidence[, commit]).
for _module in ("claims_history", "claims_kernel_notes", "claims_run_notes"):
    CLAIMS += [Claim(*row) for row in __import__(_module).ROWS]

UNTRACED: dict[str, tuple[int, str]] = {}  # every scanned page is traced now (issue 33)


def normalise(text: str) -> str:
    return " ".join(text.split())


def source_text(path: str, commit: str = "") -> str:
    """A committed file's text; ``ARCHIVE.tar.gz::MEMBER`` reads one member of a tarball."""
    if "::" in path:
        archive, member = path.split("::", 1)
        with tarfile.open(ROOT / archive) as tar:
            data = tar.extractfile(member).read()
        return normalise(data.decode(errors="replace"))
    if commit:
        data = subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    else:
        data = (ROOT / path).read_bytes()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return normalise(data.decode(errors="replace"))


def headline_strings() -> list[str]:
    return [fig for _, fig, _ in headline_figures.figures()]


def covered_spans(page: str, text: str, headlines: list[str]) -> list[tuple[int, int]]:
    spans = []
    quotes = [c.quote for c in CLAIMS if c.page == page] + headlines
    for quote in quotes:
        q = normalise(quote)
        spans += [(m.start(), m.end()) for m in re.finditer(re.escape(q), text)]
    return spans


def untraced_figures(page: str, headlines: list[str]) -> list[str]:
    text = normalise((ROOT / page).read_text(encoding="utf-8"))
    spans = covered_spans(page, text, headlines)
    found = []
    for m in FIGURE.finditer(text):
        if not any(a <= m.start() < b for a, b in spans):  # the number is inside a quote
            found.append(f"{m.group(0)!r} in ...{text[max(0, m.start() - 50) : m.end() + 30]}...")
    return found


def generated(page: str) -> bool:
    return page in GENERATED or any(p.fullmatch(page) for p in GENERATED_PATTERNS)


def check() -> list[str]:
    """Every problem, one line each: a claim whose quote or evidence is missing, an untraced
    figure on a page not in UNTRACED, or an UNTRACED count that is not exact."""
    problems = []
    for c in CLAIMS:
        if normalise(c.quote) not in normalise((ROOT / c.page).read_text(encoding="utf-8")):
            problems.append(f"{c.page}: quote not found: {c.quote!r}")
        try:
            text = source_text(c.source, c.commit)
        except (OSError, subprocess.CalledProcessError) as exc:
            problems.append(f"{c.page}: source {c.source} unreadable: {exc}")
            continue
        if normalise(c.evidence) not in text:
            problems.append(f"{c.page}: {c.source} does not hold {c.evidence!r}")
    headlines = headline_strings()
    for page in scanned_pages():
        if generated(page):
            continue
        left = untraced_figures(page, headlines)
        if page in UNTRACED:
            expected = UNTRACED[page][0]
            if len(left) != expected:
                problems.append(f"{page}: {len(left)} untraced figures, UNTRACED says {expected}")
        else:
            problems += [f"{page}: untraced figure {f}" for f in left]
    for page in UNTRACED:
        if page not in scanned_pages():
            problems.append(f"{page}: in UNTRACED but not a scanned page")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on any problem")
    args = ap.parse_args()
    print("| page | figure's words | source | evidence |")
    print("| --- | --- | --- | --- |")
    for c in CLAIMS:
        src = f"{c.source} @ {c.commit[:7]}" if c.commit else c.source
        print(f"| {c.page} | {c.quote} | {src} | {c.evidence} |")
    for page, (count, why) in UNTRACED.items():
        print(f"| {page} | {count} figures not traced yet | - | {why} |")
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{len(CLAIMS)} claims; {len(problems)} problem(s)", file=sys.stderr)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
