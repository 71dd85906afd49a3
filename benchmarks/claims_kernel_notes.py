# ruff: noqa: E501  (rows quote the page and the outputs verbatim; long strings read better whole)
"""Claims for benchmarks/NOTES-kernel.md: rows of doc_figures.Claim's fields.

Each row is (page, quote, source, evidence) or (page, quote, source, evidence, commit); see
doc_figures.py for what each field means. Most sources are the kernel runs' outputs, which left
the tree in issue 31: `row` reads a file from the tree when it is still there, else at 03662fa.
"""

from pathlib import Path

PAGE = "benchmarks/NOTES-kernel.md"
OLD = "03662fa"  # the last commit with every results/ file the notebook names
RES = "benchmarks/results"
ROOT = Path(__file__).resolve().parent.parent


def row(quote: str, name: str, evidence: str) -> tuple[str, ...]:
    """A claim on this page whose source is results/NAME (or another repository path)."""
    path = name if "/" in name and not name.startswith(("builtin_", "tuner_vllm")) else f"{RES}/{name}"
    if (ROOT / path).exists():
        return (PAGE, quote, path, evidence)
    return (PAGE, quote, path, evidence, OLD)


R1 = "kernel_h200_2026-12-02_run1.txt"
R2 = "kernel_h200_2026-12-02_run2.txt"
R3 = "kernel_h200_2026-12-02_run3_variants.txt"
R4 = "kernel_h200_2026-12-02_run4.txt"
R5 = "kernel_h200_2026-12-02_run5_chain.txt"
R6 = "kernel_h200_2026-12-02_run6.txt"
R7 = "kernel_h200_2026-12-02_run7_chain-preload.txt"
R8 = "kernel_h200_2026-12-03_run8_decode-gemv.txt"
R9 = "kernel_h200_2026-12-03_run9_decode-dot.txt"
R10 = "kernel_h200_2026-12-03_run10_decode-backoff.txt"
R11 = "kernel_h200_2026-12-03_run11_decode-slice.txt"
R12 = "kernel_h200_2026-12-03_run12_decode-slice.txt"
R18 = "kernel_h200_2026-12-03_run18_persistent.txt"
R20 = "kernel_h200_2026-12-03_run20_persistent-rule.txt"
CEIL = "benchmarks/gpu_ceilings.py"
TVK = "tuner_vllm_kernel_h200_2026-12-04"
BVV = "builtin_vs_vllm_h200_2026-12-04"
PATHS = "builtin_path_choice_h200_2026-12-04/tune_summary.json"

# Evidence strings that several rows share.
R3_TMA_BEST = (
    "ptr 779.0759801864624 tma 719.3120121955872 {'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, "
    "'BLOCK_SIZE_K': 64, 'GROUP_SIZE_M': 16, 'num_warps': 8, 'num_stages': 3}"
)
R3_CEIL = "read 4280 GB/s, bf16 matmul 779 TFLOP/s"
R4_CEIL = "read 4243 GB/s (a 75.5 MB read: 3007 GB/s)"
R6_STREAM = "stream 75.5 MB one launch: 1056 programs block 2048 w4: 20.0 us = 3776 GB/s"
R6_M1 = "bf16 M= 1 gemms 24.4 us fused 34.0 us x1.39 roof(gemms) 70.7%"
R7_M1 = "bf16 M= 1 gemms 24.2 us fused 34.3 us x1.42 roof(gemms) 73.5%"
R7_M4096 = "bf16 M= 4096 gemms 755.7 us fused 853.0 us x1.13 roof(gemms) 52.1%"
R6_M4096 = "bf16 M= 4096 gemms 704.5 us fused 834.2 us x1.18 roof(gemms) 55.4%"
R8_M1 = (
    "decode vs grouped M=1 (floor 17.3 us): decode gemms 28.1 (61.6%) fused 29.2 err 2.3e-03 "
    "grouped gemms 23.4 (73.8%) fused 33.7"
)
R9_M1 = (
    "decode vs grouped M=1 (floor 17.4 us): decode gemms 29.3 (59.3%) fused 30.6 err 2.8e-03 "
    "grouped gemms 23.5 (74.0%) fused 33.9"
)
R10_M1 = (
    "decode vs grouped M=1 (floor 17.2 us): decode gemms 26.4 (65.4%) fused 27.3 err 2.8e-03 "
    "grouped gemms 23.4 (73.8%) fused 33.6 err 3.8e-03 decode-shipped gemms 30.7 (56.1%) fused 31.9"
)
R11_M1 = (
    "decode vs grouped M=1 (floor 17.5 us): decode-slice gemms 26.0 (67.5%) fused 26.0 err 2.4e-03 "
    "decode-ticket gemms 27.3 (64.2%) fused 28.4 err 2.8e-03 grouped gemms 23.6 (74.3%) fused 33.9"
)
R12_M1 = (
    "decode vs grouped M=1 (floor 17.8 us): decode-slice gemms 26.1 (68.0%) fused 26.1 err 2.4e-03 "
    "decode-ticket gemms 27.4 (64.8%) fused 28.4 err 2.8e-03 grouped gemms 23.6 (75.1%) fused 34.1"
)
R18_S4 = (
    "one-tile gemms 768.6 (51.5%) fused 862.4 err 3.9e-03 p2-flat gemms 757.8 (52.3%) fused 856.3 "
    "err 3.9e-03 p2-nested gemms 784.8 (50.5%) fused 860.6 err 3.9e-03 p12-flat gemms 718.8 (55.1%) "
    "fused 840.9 err 3.9e-03 p12-nested gemms 757.1"
)
R18_S3 = (
    "one-tile gemms 772.7 (51.3%) fused 862.5 err 3.9e-03 p2-flat gemms 751.2 (52.7%) fused 861.0 "
    "err 3.9e-03 p2-nested gemms 767.4 (51.6%) fused 873.0 err 3.9e-03 p12-flat gemms 706.8 (56.0%) "
    "fused 826.8 err 3.9e-03 p12-nested gemms 758.0"
)

ROWS: list[tuple[str, ...]] = [
    # Sizes the page repeats: M=1 streams 8 experts' bf16 weights; the read ceiling reads 2 GiB.
    row("75.5 MB", CEIL, "(8 experts' bf16 weights, 75.5 MB)"),
    row("75 MB", CEIL, "(8 experts' bf16 weights, 75.5 MB)"),
    row("2 GiB", CEIL, "# 2 GiB of float32"),
    # The two numbers (run 2's ceilings)
    row("309 GFLOP = 398 us at 777 TFLOP/s (run 2's ceiling: its GEMMs' 802.7 us read 49.6 % of it)",
        R2, "bf16 matmul 777 TFLOP/s"),
    row("309 GFLOP = 398 us at 777 TFLOP/s (run 2's ceiling: its GEMMs' 802.7 us read 49.6 % of it)",
        R2, "M= 4096 gemms 802.7 us fused 886.2 us x1.10 roof(gemms) 49.6% flops(gemms) 49.6%"),
    row('the "roofline" fractions there read 100-103 %', R2,
        "| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102.5% | 94.3% | 0.8% | 3.93e-03 | "
        "| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% | 96.7% | 2.2% | 3.89e-03 | "
        "| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |"),
    row("measured ceilings (100-103 %)", R2, "| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% |"),
    row("measured ceilings (100-103 %)", R2, "| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |"),
    # Run 2's table
    row("| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71 % |", R2, "| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71.4% |"),
    row("| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102 % |", R2, "| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102.5% |"),
    row("| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103 % |", R2, "| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% |"),
    row("| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100 % |", R2, "| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |"),
    row("| bf16 | 1024 | 344.3 | 398.5 | 1.16 | 86 % |", R2, "| bf16 | 1024 | 344.3 | 398.5 | 1.16 | 86.2% |"),
    row("| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 50 % of matmul |", R2,
        "| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% | 44.9% | 49.6% |"),
    row("| fp8 [128,128] | 1 | 19.5 | 31.7 | 1.62 | 47 % |", R2, "| fp8_block | 1 | 19.5 | 31.7 | 1.62 | 47.2% |"),
    row("| fp8 [128,128] | 16 | 105.9 | 123.0 | 1.16 | 92 % |", R2,
        "| fp8_block | 16 | 105.9 | 123.0 | 1.16 | 92.4% |"),
    row("| fp8 [128,128] | 64 | 154.2 | 174.4 | 1.13 | 94 % |", R2,
        "| fp8_block | 64 | 154.2 | 174.4 | 1.13 | 93.7% |"),
    row("| fp8 [128,128] | 256 | 176.5 | 201.2 | 1.14 | 84 % |", R2,
        "| fp8_block | 256 | 176.5 | 201.2 | 1.14 | 83.7% |"),
    row("| fp8 [128,128] | 1024 | 230.8 | 286.7 | 1.24 | 65 % |", R2,
        "| fp8_block | 1024 | 230.8 | 286.7 | 1.24 | 64.7% |"),
    row("| fp8 [128,128] | 4096 | 676.5 | 779.8 | 1.15 | 32 % of fp8 matmul |", R2,
        "| fp8_block | 4096 | 676.5 | 779.8 | 1.15 | 32.2% | 27.9% | 32.2% |"),
    row("differ by up to 5 % (M=4096: 763.2 vs 802.7 us)", R1, "| bf16 | 4096 | 763.2 | 870.6 |"),
    row("differ by up to 5 % (M=4096: 763.2 vs 802.7 us)", R2, "| bf16 | 4096 | 802.7 | 886.2 |"),
    row("of the floor (71-72 %)", R1, "| bf16 | 1 | 25.3 | 36.3 | 1.43 | 71.9% |"),
    row("of the floor (71-72 %)", R2, "| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71.4% |"),
    row("of the matmul ceiling (50-52 %)", R1, "| bf16 | 4096 | 763.2 | 870.6 | 1.14 | 51.9% | 45.5% | 51.9% |"),
    row("of the matmul ceiling (50-52 %)", R2, "| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% | 44.9% | 49.6% |"),
    # What I tried
    row("878 -> 780 us whole call at M=4096, 309 -> 287 us at 1024", R1,
        "| fp8_block | 1024 | 230.3 | 308.5 | 1.34 | 64.1% | 47.8% | 23.7% | 4.35e-02 | "
        "| fp8_block | 4096 | 664.5 | 878.1 |"),
    row("878 -> 780 us whole call at M=4096, 309 -> 287 us at 1024", R2,
        "| fp8_block | 1024 | 230.8 | 286.7 | 1.24 | 64.7% | 52.1% | 23.6% | 4.35e-02 | "
        "| fp8_block | 4096 | 676.5 | 779.8 |"),
    row("fused 36.3 -> 37.1 us at M=1", R1, "M= 1 gemms 25.3 us fused 36.3 us"),
    row("fused 36.3 -> 37.1 us at M=1", R2, "M= 1 gemms 25.8 us fused 37.1 us"),
    row("M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)", R1, "sweep bf16 M=1: best of 11 25.1 us"),
    row("M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)", R1, "bf16 M= 1 gemms 25.3 us"),
    row("fp8 at M=1 (47 %)", R2, "fp8_block M= 1 gemms 19.5 us fused 31.7 us x1.62 roof(gemms) 47.2%"),
    row("The fp8 M=1 whole call (31.7 vs 19.5 us)", R2, "| fp8_block | 1 | 19.5 | 31.7 |"),
    # Run 3
    row("it is 2.6x slower (66.6 us vs 24.9)", R3,
        "variants bf16 M=1: grouped-ptr gemms 24.9 fused 36.3 err 3.8e-03 grouped-tma gemms 25.2 "
        "fused 36.9 err 3.8e-03 decode gemms 66.6"),
    row("found 25.1 us at best (BN 16, BK 256,\n   8 warps)", R3,
        "decode sweep M=1: 25.1 us {'BLOCK_SIZE_M': 16, 'BLOCK_SIZE_N': 16, 'BLOCK_SIZE_K': 256, "
        "'GROUP_SIZE_M': 1, 'num_warps': 8"),
    row("at M=2 it loses on the GEMMs (45.6 vs 41.6 us)", R3, "decode sweep M=2: 45.6 us"),
    row("at M=2 it loses on the GEMMs (45.6 vs 41.6 us)", R3, "variants bf16 M=2: grouped-ptr gemms 41.6"),
    row("4096 773.5 -> 760.9 us", R3, "variants bf16 M=4096: grouped-ptr gemms 773.5 fused 866.7 err 3.9e-03 "
        "grouped-tma gemms 760.9"),
    row("TMA was faster for every bf16 config (by 1-11 %)", R3, "ptr 952.1440267562866 tma 942.7480101585388"),
    row("TMA was faster for every bf16 config (by 1-11 %)", R3, "ptr 885.3440284729004 tma 787.7799868583679"),
    row("**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n"
        "   against 760.1 us for the best pointer config", R3, R3_TMA_BEST),
    row("**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n"
        "   against 760.1 us for the best pointer config", R3, R3_CEIL),
    row("**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n"
        "   against 760.1 us for the best pointer config", R3, "ptr 760.0560188293457"),
    row("configs with 8 warps (+0.7-5.6 %)", R3, "ptr 1218.06800365448 tma 1286.1239910125732"),
    row("configs with 8 warps (+0.7-5.6 %)", R3, "ptr 1248.196005821228 tma 1257.0680379867554"),
    row("(55.2 %, TMA sweep)", R3, R3_TMA_BEST),
    row("the shipped config with TMA reaches 53.6 %", R3,
        "bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6%"),
    row("(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)",
        R3, "variants bf16 M=1: grouped-ptr gemms 24.9"),
    row("(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)",
        R3, "read 4280 GB/s"),
    row("(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)",
        R3, "decode sweep M=1: 25.1 us"),
    # Run 4
    row("3007 GB/s**, 71 % of the 2 GiB read rate", R4, R4_CEIL),
    row("| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70 % |", R4, "| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70.2% |"),
    row("| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101 % |", R4, "| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101.1% |"),
    row("| bf16 | 64 | 280.9 | 299.1 | 1.06 | 99 % |", R4, "| bf16 | 64 | 280.9 | 299.1 | 1.06 | 99.4% |"),
    row("| bf16 | 256 | 292.2 | 314.6 | 1.08 | 98 % |", R4, "| bf16 | 256 | 292.2 | 314.6 | 1.08 | 97.6% |"),
    row("| bf16 | 1024 | 343.9 | 394.8 | 1.15 | 83 % |", R4, "| bf16 | 1024 | 343.9 | 394.8 | 1.15 | 83.3% |"),
    row("| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9 % of matmul |", R4,
        "| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9% | 46.9% | 53.9% |"),
    row("| fp8 [128,128] | 1 | 19.6 | 31.7 | 1.62 | 45 % |", R4, "| fp8_block | 1 | 19.6 | 31.7 | 1.62 | 45.3% |"),
    row("| fp8 [128,128] | 16 | 106.0 | 122.9 | 1.16 | 89 % |", R4,
        "| fp8_block | 16 | 106.0 | 122.9 | 1.16 | 89.3% |"),
    row("| fp8 [128,128] | 64 | 151.9 | 171.7 | 1.13 | 92 % |", R4,
        "| fp8_block | 64 | 151.9 | 171.7 | 1.13 | 92.0% |"),
    row("| fp8 [128,128] | 256 | 176.9 | 201.2 | 1.14 | 81 % |", R4,
        "| fp8_block | 256 | 176.9 | 201.2 | 1.14 | 80.7% |"),
    row("| fp8 [128,128] | 1024 | 228.7 | 278.9 | 1.22 | 63 % |", R4,
        "| fp8_block | 1024 | 228.7 | 278.9 | 1.22 | 63.1% |"),
    row("| fp8 [128,128] | 4096 | 665.7 | 779.1 | 1.17 | 33 % of fp8 matmul |", R4,
        "| fp8_block | 4096 | 665.7 | 779.1 | 1.17 | 33.3% |"),
    row("(70-72 % in every run, both paths)", R4, "| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70.2% |"),
    row("(70-72 % in every run, both paths)", R1, "| bf16 | 1 | 25.3 | 36.3 | 1.43 | 71.9% |"),
    row("at 2.98 TB/s, 99 % of what a plain torch read", R4, "bf16 M= 1 gemms 25.3 us"),
    row("at 2.98 TB/s, 99 % of what a plain torch read", R4, R4_CEIL),
    row("to beat the best single read torch does at that size by 6 %", R4, R4_CEIL),
    row("55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)", R3, R3_TMA_BEST),
    row("55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)", R3,
        "bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6%"),
    row("55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)", R4,
        "| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9% |"),
    row("51.7 % with\n  exhaustive's pick (tuner run 5, another machine: `gemms_us` 771.6 us against that run's\n"
        "  775 TFLOP/s ceiling", "tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json",
        '"gemms_us": 771.6400146484375'),
    row("51.7 % with\n  exhaustive's pick (tuner run 5, another machine: `gemms_us` 771.6 us against that run's\n"
        "  775 TFLOP/s ceiling", "tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json",
        '"matmul_flops_per_s": 774985101430877.2'),
    row("the 52.9 %\n  quoted here before divided GEMM 1 + GEMM 2 timed apart, 750.7 us, by run 3's ceiling",
        "tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json",
        '"gemm1_us": 464.302396774292, "gemm2_us": 286.40480041503906'),
    row("the 52.9 %\n  quoted here before divided GEMM 1 + GEMM 2 timed apart, 750.7 us, by run 3's ceiling",
        R3, R3_CEIL),
    row("Up from 50-52 % with pointer loads (runs 1-2)", R1, "| bf16 | 4096 | 763.2 | 870.6 | 1.14 | 51.9% |"),
    row("Up from 50-52 % with pointer loads (runs 1-2)", R2, "| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% |"),
    row("(bf16, 98-101 %)", R4, "| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101.1% |"),
    row("(bf16, 98-101 %)", R4, "| bf16 | 256 | 292.2 | 314.6 | 1.08 | 97.6% |"),
    row("with the shipped config, 36.3 us", R3, "variants bf16 M=1: grouped-ptr gemms 24.9 fused 36.3"),
]
