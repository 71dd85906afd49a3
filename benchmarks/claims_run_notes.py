"""Claims for the runs' notes (benchmarks/results/*/) and benchmarks/gpu_local/README.md.

Rows of doc_figures.Claim's fields.

Each row is (page, quote, source, evidence) or (page, quote, source, evidence, commit); see
doc_figures.py for what each field means. Several rows may share a quote when its figures
come from more than one line (a range's two ends, or a sum's terms).
"""

R = "benchmarks/results"
OLD = "03662fa"  # files that left the tree in issue 31 are read at this commit

# benchmarks/gpu_local/README.md
KIT = "benchmarks/gpu_local/README.md"
BUILD = "workflow/cellbench/assets/build.py"
RUN_SH = "benchmarks/gpu_local/run.sh"

# the first H200 run of the kit
GL = f"{R}/gpu_local_h200_2026-12-04"
GL_NOTES = f"{GL}/NOTES.md"
GL_RUN1 = f"{GL}/snakemake_run1_deadline.txt.gz"
GL_RUN2 = f"{GL}/snakemake_run2.txt.gz"
MOE_SHARE = f"{GL}/moe_share.txt"

# waves 19 and 24 of the kit
W19 = f"{R}/gpu_local_h200_2026-12-04_wave19"
W24 = f"{R}/gpu_local_h200_2026-12-04_wave24"
CONSOLE = "results/logs/snakemake.txt"
TUNED_BENCH = "results/host-cuda/small-qwen3-moe/tp1-ep1/serve/tuned/bench.json"

# issue 33 on one H100
I33 = f"{R}/issue33_h100_2026-12-05"
I33_NOTES = f"{I33}/README.md"
I33_FP8 = f"{I33}/tuner_vllm_kernel_h200_fp8.txt"
I33_BF16_A = f"{I33}/tuner_vllm_kernel_h200_bf16.txt"
I33_BF16_B1 = f"{I33}/tuner_vllm_kernel_h100_bf16_M512-1536.txt"
I33_BF16_B2 = f"{I33}/tuner_vllm_kernel_h100_bf16_M4096.txt"
I33_SUM_PROC = (
    "process walls default 42.9 + 28.0 + 22.2 = 93.1 s / exhaustive 431.2 + 279.2 + 150.2 = "
    "860.6 s = **0.108**"
)
I33_SUM_TUNE = (
    "per-M tuning walls 25.3 + 13.7 + 8.2 = 47.2 s / 414.2 + 261.3 + 135.2 = 810.7 s = 0.058"
)

# the tuner on vLLM's kernel, H200, first and second runs
VK1 = f"{R}/tuner_vllm_kernel_h200_2026-12-04"
VK2 = f"{R}/tuner_vllm_kernel_h200_2026-12-04_run2"
VK2_NOTES = f"{VK2}/README.md"
VK2_BF16 = f"{VK2}/tuner_vllm_kernel_h200_bf16.txt"
VK2_LOG = f"{VK2}/tuner_vllm_kernel_h200.log.gz"

# GPU tests on one H100, and the builtin kernel's path choice on one H200
GT = f"{R}/gpu_tests_h100_2026-12-06"
GT_NOTES = f"{GT}/README.md"
PC = f"{R}/builtin_path_choice_h200_2026-12-04"
PC_NOTES = f"{PC}/README.md"
PC_PATHS = "grouped 25.7 / 40.8 / 72.9 us against few-token 28.2 / 54.1 / 90.0 us at M = 1 / 2 / 4"

# the plan of issue 33's tuner walls
PLAN = f"{R}/tuner_walls_issue33/PLAN.md"
PER_TIMING = "0.082 s per timing as measured at M=16,256,4096 x 17344 timings"

# wave 19's gain of the pick over the default, one report row per M (M = 1 and 2048 in ROWS)
W19_GAINS = "50.7, 49.0, 24.3, 5.8, 5.0, 5.3, 4.7, 3.8, 4.2, 1.4, 71.2, 77.0 %"
W19_GAIN_ROWS = [
    "| 2 | 16 | 64 | 128 | 64 | 4 | 5 | 43.125 | default | 85.133 | 43.413 | 49.0 |",
    "| 4 | 16 | 128 | 128 | 64 | 4 | 4 | 73.235 | default | 96.382 | 72.962 | 24.3 |",
    "| 8 | 16 | 128 | 256 | 1 | 4 | 2 | 123.408 | default | 130.139 | 122.574 | 5.8 |",
    "| 16 | 16 | 64 | 256 | 1 | 4 | 2 | 187.104 | default | 196.973 | 187.061 | 5.0 |",
    "| 32 | 16 | 64 | 128 | 1 | 4 | 3 | 259.056 | default | 272.272 | 257.883 | 5.3 |",
    "| 64 | 16 | 64 | 256 | 1 | 4 | 2 | 286.355 | default | 300.894 | 286.885 | 4.7 |",
    "| 128 | 16 | 64 | 256 | 1 | 4 | 2 | 302.434 | default | 312.302 | 300.579 | 3.8 |",
    "| 256 | 32 | 256 | 128 | 1 | 4 | 2 | 309.818 | default | 321.958 | 308.365 | 4.2 |",
    "| 512 | 64 | 256 | 64 | 1 | 8 | 4 | 336.048 | default | 339.955 | 335.181 | 1.4 |",
    "| 1024 | 128 | 256 | 64 | 1 | 8 | 4 | 369.475 | default | 1279.043 | 368.510 | 71.2 |",
]

ROWS: list[tuple[str, ...]] = [
    # benchmarks/gpu_local/README.md: the model's size from its shapes (build.py works it out:
    # 8 layers x 128 experts x 3 x 2048 x 768 bf16 weights are 9.7 GB, attention 0.3 GB more);
    # the log cut is run.sh's own; the 64 MiB limit is the device call's, as the ops packer says
    (KIT, "8 layers, ~10 GB)", BUILD, "in bf16: about 10 GB of weights, 97 % of them experts"),
    (KIT, "each cut to its last 4 MiB", RUN_SH, 'tail -c 4194304 "$f"'),
    (
        KIT,
        "call's working tree (at most 64 MiB)",
        "benchmarks/vllm_ops_pack.py",
        "more than a device call's working tree may hold (64 MiB)",
    ),
    # benchmarks/results/gpu_local_h200_2026-12-04/NOTES.md: run 1's and run 2's consoles
    (GL_NOTES, "The model build (~10 GB drawn on the GPU)", BUILD, "about 10 GB of weights"),
    (
        GL_NOTES,
        "(12 batch sizes, 50 s between the log's timestamps)",
        GL_RUN1,
        "[Fri Dec 4 05:04:41 2026] localrule tune:",
        OLD,
    ),
    (
        GL_NOTES,
        "(12 batch sizes, 50 s between the log's timestamps)",
        GL_RUN1,
        "[Fri Dec 4 05:05:31 2026] Finished jobid: 2 (Rule: tune)",
        OLD,
    ),
    (
        GL_NOTES,
        "(12 batch sizes, 50 s between the log's timestamps)",
        GL_RUN1,
        "--batch-sizes 1,2,4,8,16,32,64,128,256,512,1024,2048",
        OLD,
    ),
    (GL_NOTES, "`run.sh`'s 480 s deadline sent SIGINT", RUN_SH, "deadline=480", "469409b"),
    (
        GL_NOTES,
        "`snakemake all` in 6 min 55 s of wall",
        GL_RUN2,
        "Elapsed time: 0:06:54.535952",
        OLD,
    ),
    # the MoE bound against TPOT: moe_share.txt, one line per point and arm
    *[
        (GL_NOTES, quote, MOE_SHARE, line)
        for quote, lines in (
            (
                "0.22 ms of a 15-19 ms TPOT at concurrency 1 (1.2-1.5 %)",
                (
                    "256-64 @c1 | untuned | 15.22 (13.78-16.50) | 0.22 | 1.5%",
                    "2048-32 @c1 | untuned | 17.36 (9.52-23.70) | 0.22 | 1.3%",
                    "256-64 @c1 | tuned | 19.26 (16.40-22.08) | 0.22 | 1.2%",
                    "2048-32 @c1 | tuned | 16.28 (13.70-18.58) | 0.22 | 1.4%",
                ),
            ),
            (
                "1.50 ms of 26-57 ms at concurrency 16 (2.6-5.8 %)",
                (
                    "256-64 @c16 | untuned | 25.79 (24.28-27.81) | 1.50 | 5.8%",
                    "2048-32 @c16 | untuned | 57.18 (39.14-91.87) | 1.50 | 2.6%",
                    "256-64 @c16 | tuned | 25.98 (24.79-27.08) | 1.50 | 5.8%",
                    "2048-32 @c16 | tuned | 51.56 (35.66-78.86) | 1.50 | 2.9%",
                ),
            ),
            (
                "up to 9.5-23.7 ms (2048-32 @c1, untuned)",
                ("2048-32 @c1 | untuned | 17.36 (9.52-23.70) | 0.22 | 1.3%",),
            ),
            (
                "39-92 ms (2048-32 @c16, untuned)",
                ("2048-32 @c16 | untuned | 57.18 (39.14-91.87) | 1.50 | 2.6%",),
            ),
        )
        for line in lines
    ],
    # benchmarks/results/gpu_local_h200_2026-12-04_wave19/NOTES.md
    (
        f"{W19}/NOTES.md",
        "`snakemake all` in 7 min 43 s, exit 0",
        f"{W19}/results.tar.gz::{CONSOLE}",
        "Elapsed time: 0:07:42.838298",
    ),
    (
        f"{W19}/NOTES.md",
        "50.7, 49.0, 24.3, 5.8, 5.0, 5.3, 4.7, 3.8, 4.2, 1.4, 71.2, 77.0 %",
        f"{W19}/report.md",
        "| 1 | 16 | 128 | 256 | 64 | 4 | 3 | 27.797 | default | 56.794 | 27.971 | 50.7 |",
    ),
    (
        f"{W19}/NOTES.md",
        "50.7, 49.0, 24.3, 5.8, 5.0, 5.3, 4.7, 3.8, 4.2, 1.4, 71.2, 77.0 %",
        f"{W19}/report.md",
        "| 2048 | 128 | 256 | 64 | 1 | 8 | 4 | 504.910 | default | 2013.965 | 462.405 | 77.0 |",
    ),
    (
        f"{W19}/NOTES.md",
        "the median spread of one repeat was 16.8 %, so a 5 % change would need 179 repeats a side",
        f"{W19}/report.md",
        "(median CV 16.80% of a repeat), a 5% change needs 179 repeats a side to be seen",
    ),
    # benchmarks/results/gpu_local_h200_2026-12-04_wave24/NOTES.md
    (
        f"{W24}/NOTES.md",
        "`snakemake all` in 7 min 32 s, exit 0",
        f"{W24}/results.tar.gz::{CONSOLE}",
        "Elapsed time: 0:07:31.874749",
    ),
    (
        f"{W24}/NOTES.md",
        "temperature and memory every 0.2 s",
        f"{W24}/results.tar.gz::{TUNED_BENCH}",
        '"interval_s": 0.2,',
    ),
    (
        f"{W24}/NOTES.md",
        "(median CV of a repeat 17 %)",
        f"{W24}/report.md",
        "(median CV 17.31% of a repeat)",
    ),
    # benchmarks/results/issue33_h100_2026-12-05/README.md: the card, each call's console clock
    # at its last step, the two tables of calls 1 and 2, and the sums over all four calls
    (
        I33_NOTES,
        "Card: **NVIDIA H100 80GB HBM3**",
        f"{I33}/device_call1.txt",
        "NVIDIA H100 80GB HBM3,",
    ),
    (
        I33_NOTES,
        "(NVIDIA H100 80GB HBM3, `device_call3.txt`, `device_call4.txt`)",
        f"{I33}/device_call3.txt",
        "NVIDIA H100 80GB HBM3,",
    ),
    (
        I33_NOTES,
        "call 1 (414 s)",
        f"{I33}/console_call1.log.gz",
        "[issue33_gpu +414s] step tuner:fp8:1,4,16,32,64,128,512,1536,4096 exit 0",
    ),
    (
        I33_NOTES,
        "call 2 (493 s)",
        f"{I33}/console_call2.log.gz",
        "[issue33_gpu +493s] step tuner:bf16:1,4,16,32,64,128 exit 0",
    ),
    (
        I33_NOTES,
        "call 3 (338 s)",
        f"{I33}/console_call3.log.gz",
        "[issue33_gpu +338s] step tuner:bf16:512,1536 exit 0",
    ),
    (
        I33_NOTES,
        "call 4 (191 s)",
        f"{I33}/console_call4.log.gz",
        "[issue33_gpu +191s] step tuner:bf16:4096 exit 0",
    ),
    (
        I33_NOTES,
        "default 51.9 s / exhaustive 254.9 s = **0.204** (process walls)",
        I33_FP8,
        "default 51.9 s / exhaustive 254.9 s = 0.204",
    ),
    (
        I33_NOTES,
        "per-M tuning walls 34.5 / 236.4 s = 0.146",
        I33_FP8,
        "tuning wall at M=1,4,16,32,64,128,512,1536,4096: default 34.5 s / exhaustive 236.4 s "
        "= 0.146",
    ),
    (
        I33_NOTES,
        "default 42.9 s / exhaustive 431.2 s = **0.100** (process walls)",
        I33_BF16_A,
        "default 42.9 s / exhaustive 431.2 s = 0.100",
    ),
    (
        I33_NOTES,
        "per-M tuning walls 25.3 / 414.2 s = 0.061",
        I33_BF16_A,
        "tuning wall at M=1,4,16,32,64,128: default 25.3 s / exhaustive 414.2 s = 0.061",
    ),
    (I33_NOTES, "one call (600 s at most)", RUN_SH, "The device call's own limit is 600 s"),
    (I33_NOTES, I33_SUM_PROC, I33_BF16_A, "default 42.9 s / exhaustive 431.2 s"),
    (I33_NOTES, I33_SUM_PROC, I33_BF16_B1, "default 28.0 s / exhaustive 279.2 s"),
    (I33_NOTES, I33_SUM_PROC, I33_BF16_B2, "default 22.2 s / exhaustive 150.2 s"),
    (I33_NOTES, I33_SUM_TUNE, I33_BF16_A, "default 25.3 s / exhaustive 414.2 s"),
    (I33_NOTES, I33_SUM_TUNE, I33_BF16_B1, "default 13.7 s / exhaustive 261.3 s"),
    (I33_NOTES, I33_SUM_TUNE, I33_BF16_B2, "default 8.2 s / exhaustive 135.2 s"),
    # benchmarks/results/tuner_vllm_kernel_h200_2026-12-04_run2/README.md
    (VK2_NOTES, "460.7 s of wall by the script's own clock", VK2_LOG, "total wall 460.7 s"),
    (
        VK2_NOTES,
        "83.1 s of wall (target: at most 2 minutes)",
        VK2_BF16,
        "default mode, 18 batch sizes: wall 83.1 s (target <= 120 s for all 18: met)",
    ),
    (
        VK2_NOTES,
        "default 14.9 s, exhaustive 257.7 s: **0.058**",
        VK2_BF16,
        "tuning wall at M=16,256,4096: default 14.9 s / exhaustive 257.7 s = 0.058",
    ),
    (
        VK2_NOTES,
        "at ~1436 s (its measured 0.082 s per timing x the 17,344 timings",
        VK2_BF16,
        f"exhaustive at all 18 M ~ 1436 s ({PER_TIMING} counted on the CPU",
    ),
    (
        VK2_NOTES,
        "1.005 at M=256 (within 1%)",
        VK2_BF16,
        "worst def/exh 1.005 at M=256 (target <= 1.01: met)",
    ),
    (
        VK2_NOTES,
        "fp8: default mode 61.5 s for 18 batch sizes",
        f"{VK2}/tuner_vllm_kernel_h200_fp8.txt",
        "default mode, 18 batch sizes: wall 61.5 s",
    ),
    (
        VK2_NOTES,
        "no exhaustive (25 s of budget left)",
        VK2_LOG,
        "fp8: exhaustive skipped (25 s of the budget left)",
    ),
    # benchmarks/results/tuner_vllm_kernel_h200_2026-12-04/README.md
    (
        f"{VK1}/README.md",
        "82.4 s wall (bf16), 58.6 s (fp8)",
        f"{VK1}/tuner_vllm_kernel_h200_bf16.txt",
        "default: wall 82.4 s (process 86.0 s)",
    ),
    (
        f"{VK1}/README.md",
        "82.4 s wall (bf16), 58.6 s (fp8)",
        f"{VK1}/tuner_vllm_kernel_h200_fp8.txt",
        "default: wall 58.6 s (process 63.0 s)",
    ),
    # benchmarks/results/gpu_tests_h100_2026-12-06/README.md
    (
        GT_NOTES,
        "(one H100 80GB HBM3, device tool, 2026-12-06)",
        f"{GT}/after_merge_gpu_tests.txt.gz",
        "device_name=NVIDIA_H100_80GB_HBM3.json",
    ),
    (
        GT_NOTES,
        'gave "17 failed, 229 passed, 5 skipped"',
        f"{GT}/after_merge_gpu_tests.txt.gz",
        "17 failed, 229 passed, 5 skipped in 296.98s (0:04:56)",
    ),
    # the first 183 marks of the run (72 + 72 + 39) are dots and four s's, skipped where
    # test_kernel.py says so
    (
        GT_NOTES,
        "the first 183 tests of the run, all pass (179 passed, 4 skipped)",
        f"{GT}/after_merge_gpu_tests.txt.gz",
        "...................................s.s.........s.s...................... [ 28%] "
        "........................................................................ [ 57%] "
        ".......................................FFF",
    ),
    (
        GT_NOTES,
        "the first 183 tests of the run, all pass (179 passed, 4 skipped)",
        f"{GT}/after_merge_gpu_tests.txt.gz",
        "SKIPPED [4] tests/stage/test_kernel.py:127:",
    ),
    (
        GT_NOTES,
        'gave "19 failed, 48 passed, 1 skipped"',
        f"{GT}/before_session_gpu_tests.txt.gz",
        "19 failed, 48 passed, 1 skipped in 84.70s (0:01:24)",
    ),
    # benchmarks/results/builtin_path_choice_h200_2026-12-04/README.md
    (
        PC_NOTES,
        "19.7 s of wall for 4 batch sizes",
        f"{PC}/tune_console.txt",
        "candidates: 199 timed, 0 reused from log, 6304 pruned, 0 failed; seconds: wall 19.7",
    ),
    (
        PC_NOTES,
        "by 14.8, 9.0, 8.8 and 6.2 % at M = 1, 2, 4, 8",
        f"{PC}/tune_console.txt",
        "1 25.54 15.67 8.4 0.72 +14.8% M16_N128_K128_G1_w4_s5 "
        "2 40.46 25.65 17.59 0.91 +9.0% M16_N64_K64_G16_w4_s4 "
        "4 73.11 45.75 26.12 0.97 +8.8% M16_N64_K64_G32_w4_s3 "
        "8 125.22 75.11 39.2 0.95 +6.2% M16_N128_K256_G1_w4_s2",
    ),
    *[
        (PC_NOTES, PC_PATHS, f"{PC}/tune_summary.json", f'"grouped_us": {g}, "decode_us": {d}')
        for g, d in (
            ("25.676800310611725", "28.169600665569305"),
            ("40.76479971408844", "54.09599840641022"),
            ("72.87519872188568", "90.00479876995087"),
        )
    ],
    (
        PC_NOTES,
        "179 passed, 4 skipped, in 171 s",
        f"{PC}/gpu_kernel_tests.txt",
        "179 passed, 4 skipped in 171.39s (0:02:51)",
    ),
    # benchmarks/results/slurm_2026-12-04/NOTES.md
    (
        f"{R}/slurm_2026-12-04/NOTES.md",
        "`profiles/slurm` took 1359 s",
        f"{R}/slurm_2026-12-04/pytest_full_run.log",
        "[test_slurm] embedded default through Slurm: 1359 s wall",
    ),
    (
        f"{R}/slurm_2026-12-04/NOTES.md",
        "to save 23 min",
        f"{R}/slurm_2026-12-04/pytest_full_run.log",
        "[test_slurm] embedded default through Slurm: 1359 s wall",
    ),
    (
        f"{R}/slurm_2026-12-04/NOTES.md",
        "passed in 502 s",
        f"{R}/slurm_2026-12-04/scancel_driver.log",
        "scancel test passed in 502 s",
    ),
    # benchmarks/results/rehearsal_bump_2026-12-05/README.md
    (
        f"{R}/rehearsal_bump_2026-12-05/README.md",
        "(3 min 28 s wall for the 11 jobs)",
        f"{R}/rehearsal_bump_2026-12-05/run-jobs.txt",
        "Elapsed time: 0:03:27.989028",
    ),
    (
        f"{R}/rehearsal_bump_2026-12-05/README.md",
        "was 67% in the untuned arm and 127% in the tuned one",
        f"{R}/rehearsal_bump_2026-12-05/report.md",
        "median spread of a pair's log-ratio 66.64%",
    ),
    (
        f"{R}/rehearsal_bump_2026-12-05/README.md",
        "was 67% in the untuned arm and 127% in the tuned one",
        f"{R}/rehearsal_bump_2026-12-05/report.md",
        "median spread of a pair's log-ratio 126.80%",
    ),
    (
        f"{R}/rehearsal_bump_2026-12-05/README.md",
        "changes of -94% to +906%",
        f"{R}/rehearsal_bump_2026-12-05/report.md",
        "| 64-16 | mean_tpot_ms | 2.48 | 1.80 | -93.9% |",
    ),
    (
        f"{R}/rehearsal_bump_2026-12-05/README.md",
        "changes of -94% to +906%",
        f"{R}/rehearsal_bump_2026-12-05/report.md",
        "| 32-16 | mean_tpot_ms | 8.59 | 3.53 | +906.4% |",
    ),
    # benchmarks/results/tuner_walls_issue33/PLAN.md: the device call's limit, the seconds per
    # timing of the H200 run it names, and the timings the later tables count on the CPU (the
    # plan's expected seconds per call, counts x 0.082 s, were projections: taken off the page)
    (PLAN, "one call holds at most 10 minutes", RUN_SH, "The device call's own limit is 600 s"),
    (PLAN, "times ~0.08 s per timing from the 2026-12-04 H200 runs", VK2_BF16, PER_TIMING),
    (PLAN, "3,284 timings;", I33_FP8, "x 3284 timings counted on the CPU"),
    (PLAN, "(3,988 timings)", I33_BF16_A, "x 3988 timings counted on the CPU"),
    (PLAN, "(4,164 timings)", I33_BF16_B1, "x 2776 timings counted on the CPU"),
    (PLAN, "(4,164 timings)", I33_BF16_B2, "x 1388 timings counted on the CPU"),
    # benchmarks/results/builtin_vs_vllm_h200_2026-12-04*/README.md: the script's total wall
    (
        f"{R}/builtin_vs_vllm_h200_2026-12-04/README.md",
        "105 s of wall",
        f"{R}/builtin_vs_vllm_h200_2026-12-04/builtin_vs_vllm_h200.log.gz",
        "total wall 104.9 s",
    ),
    (
        f"{R}/builtin_vs_vllm_h200_2026-12-04_fp8-tma/README.md",
        "28 s of wall",
        f"{R}/builtin_vs_vllm_h200_2026-12-04_fp8-tma/builtin_vs_vllm_h200.log.gz",
        "total wall 27.9 s",
    ),
    # the uncut GPU run of the six test files (issue 33)
    (
        GT_NOTES,
        "250 passed, 12 skipped in 191.45s (0:03:11)",
        f"{GT}/issue33_uncut_gpu_tests.txt.gz",
        "250 passed, 12 skipped in 191.45s (0:03:11)",
    ),
    (
        "docs/testing.md",
        '"250 passed, 12 skipped in 191.45s"',
        f"{GT}/issue33_uncut_gpu_tests.txt.gz",
        "250 passed, 12 skipped in 191.45s (0:03:11)",
    ),
    # the card's name, as nvidia-smi gave it in that call
    (GT_NOTES, "NVIDIA H100 80GB HBM3", f"{GT}/issue33_uncut_card.txt", "NVIDIA H100 80GB HBM3"),
    (
        "docs/testing.md",
        "one H100 80GB HBM3",
        f"{GT}/issue33_uncut_card.txt",
        "NVIDIA H100 80GB HBM3",
    ),
    # the full test suite's run, CI=true, on this VM (docs/testing.md)
    (
        "docs/testing.md",
        '"1019 passed, 49 skipped, 3 deselected in 2732.29s"',
        "benchmarks/results/full_suite_2026-12-06.txt.gz",
        "1019 passed, 49 skipped, 3 deselected in 2732.29s (0:45:32)",
    ),
]
ROWS += [(f"{W19}/NOTES.md", W19_GAINS, f"{W19}/report.md", r) for r in W19_GAIN_ROWS]
