# ruff: noqa: E501  (rows quote the page and the outputs verbatim; long strings read better whole)
"""Claims for benchmarks/NOTES-kernel.md: rows of doc_figures.Claim's fields.

Each row is (page, quote, source, evidence) or (page, quote, source, evidence, commit); see
doc_figures.py for what each field means. Most sources are the kernel runs' outputs, which left
the tree in issue 31: `row` reads a file from the tree when it is still there, else at 03662fa.
"""

from pathlib import Path

PAGE = "benchmarks/NOTES-kernel.md"
OLD = "03662fa"  # the commit the page names for results/ files that left the tree
RES = "benchmarks/results"
ROOT = Path(__file__).resolve().parent.parent


def row(quote: str, name: str, evidence: str) -> tuple[str, ...]:
    """A claim on this page whose source is results/NAME (or another repository path)."""
    path = name if name.startswith("benchmarks/") else f"{RES}/{name}"
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

# One row call a line: quotes and evidence stay whole, as they are compared.
# fmt: off
ROWS: list[tuple[str, ...]] = [
    # Sizes the page repeats: M=1 streams 8 experts' bf16 weights; the read ceiling reads 2 GiB.
    row('75.5 MB', CEIL, "(8 experts' bf16 weights, 75.5 MB)"),
    row('75 MB', CEIL, "(8 experts' bf16 weights, 75.5 MB)"),
    row('2 GiB', CEIL, '# 2 GiB of float32'),
    # The two numbers (run 2's ceilings)
    row("309 GFLOP = 398 us at 777 TFLOP/s (run 2's ceiling: its GEMMs' 802.7 us read 49.6 % of it)", R2, 'bf16 matmul 777 TFLOP/s'),
    row("309 GFLOP = 398 us at 777 TFLOP/s (run 2's ceiling: its GEMMs' 802.7 us read 49.6 % of it)", R2, 'M= 4096 gemms 802.7 us fused 886.2 us x1.10 roof(gemms) 49.6% flops(gemms) 49.6%'),
    row("309 GFLOP = 398 us at 777 TFLOP/s (run 2's ceiling: its GEMMs' 802.7 us read 49.6 % of it)", 'tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json', '"flops": 309237645312.0'),
    row('the "roofline" fractions there read 100-103 %', R2, '| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102.5% | 94.3% | 0.8% | 3.93e-03 | | bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% | 96.7% | 2.2% | 3.89e-03 | | bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |'),
    row('measured ceilings (100-103 %)', R2, '| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% |'),
    row('measured ceilings (100-103 %)', R2, '| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |'),
    # Run 2's table
    row('| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71 % |', R2, '| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71.4% |'),
    row('| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102 % |', R2, '| bf16 | 16 | 190.9 | 207.4 | 1.09 | 102.5% |'),
    row('| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103 % |', R2, '| bf16 | 64 | 280.3 | 298.9 | 1.07 | 103.1% |'),
    row('| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100 % |', R2, '| bf16 | 256 | 294.5 | 317.2 | 1.08 | 100.2% |'),
    row('| bf16 | 1024 | 344.3 | 398.5 | 1.16 | 86 % |', R2, '| bf16 | 1024 | 344.3 | 398.5 | 1.16 | 86.2% |'),
    row('| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 50 % of matmul |', R2, '| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% | 44.9% | 49.6% |'),
    row('| fp8 [128,128] | 1 | 19.5 | 31.7 | 1.62 | 47 % |', R2, '| fp8_block | 1 | 19.5 | 31.7 | 1.62 | 47.2% |'),
    row('| fp8 [128,128] | 16 | 105.9 | 123.0 | 1.16 | 92 % |', R2, '| fp8_block | 16 | 105.9 | 123.0 | 1.16 | 92.4% |'),
    row('| fp8 [128,128] | 64 | 154.2 | 174.4 | 1.13 | 94 % |', R2, '| fp8_block | 64 | 154.2 | 174.4 | 1.13 | 93.7% |'),
    row('| fp8 [128,128] | 256 | 176.5 | 201.2 | 1.14 | 84 % |', R2, '| fp8_block | 256 | 176.5 | 201.2 | 1.14 | 83.7% |'),
    row('| fp8 [128,128] | 1024 | 230.8 | 286.7 | 1.24 | 65 % |', R2, '| fp8_block | 1024 | 230.8 | 286.7 | 1.24 | 64.7% |'),
    row('| fp8 [128,128] | 4096 | 676.5 | 779.8 | 1.15 | 32 % of fp8 matmul |', R2, '| fp8_block | 4096 | 676.5 | 779.8 | 1.15 | 32.2% | 27.9% | 32.2% |'),
    row('differ by up to 5 % (M=4096: 763.2 vs 802.7 us)', R1, '| bf16 | 4096 | 763.2 | 870.6 |'),
    row('differ by up to 5 % (M=4096: 763.2 vs 802.7 us)', R2, '| bf16 | 4096 | 802.7 | 886.2 |'),
    row('of the floor (71-72 %)', R1, '| bf16 | 1 | 25.3 | 36.3 | 1.43 | 71.9% |'),
    row('of the floor (71-72 %)', R2, '| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71.4% |'),
    row('of the matmul ceiling (50-52 %)', R1, '| bf16 | 4096 | 763.2 | 870.6 | 1.14 | 51.9% | 45.5% | 51.9% |'),
    row('of the matmul ceiling (50-52 %)', R2, '| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% | 44.9% | 49.6% |'),
    # What I tried
    row('878 -> 780 us whole call at M=4096, 309 -> 287 us at 1024', R1, '| fp8_block | 1024 | 230.3 | 308.5 | 1.34 | 64.1% | 47.8% | 23.7% | 4.35e-02 | | fp8_block | 4096 | 664.5 | 878.1 |'),
    row('878 -> 780 us whole call at M=4096, 309 -> 287 us at 1024', R2, '| fp8_block | 1024 | 230.8 | 286.7 | 1.24 | 64.7% | 52.1% | 23.6% | 4.35e-02 | | fp8_block | 4096 | 676.5 | 779.8 |'),
    row('fused 36.3 -> 37.1 us at M=1', R1, 'M= 1 gemms 25.3 us fused 36.3 us'),
    row('fused 36.3 -> 37.1 us at M=1', R2, 'M= 1 gemms 25.8 us fused 37.1 us'),
    row('M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)', R1, 'sweep bf16 M=1: best of 11 25.1 us'),
    row('M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)', R1, 'bf16 M= 1 gemms 25.3 us'),
    row('M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)', R1, 'sweep bf16 M=4096: best of 11 762.6 us'),
    row('M=1 25.1 vs 25.3 us, M=4096 762.6 vs 763.2 (run 1)', R1, 'bf16 M= 4096 gemms 763.2 us'),
    row('fp8 at M=1 (47 %)', R2, 'fp8_block M= 1 gemms 19.5 us fused 31.7 us x1.62 roof(gemms) 47.2%'),
    row('The fp8 M=1 whole call (31.7 vs 19.5 us)', R2, '| fp8_block | 1 | 19.5 | 31.7 |'),
    # Run 3
    row('it is 2.7x slower (66.6 us vs 24.9)', R3, 'variants bf16 M=1: grouped-ptr gemms 24.9 fused 36.3 err 3.8e-03 grouped-tma gemms 25.2 fused 36.9 err 3.8e-03 decode gemms 66.6'),
    row('found 25.1 us at best (BN 16, BK 256,\n   8 warps)', R3, "decode sweep M=1: 25.1 us {'BLOCK_SIZE_M': 16, 'BLOCK_SIZE_N': 16, 'BLOCK_SIZE_K': 256, 'GROUP_SIZE_M': 1, 'num_warps': 8"),
    row('at M=2 it loses on the GEMMs (45.6 vs 41.6 us)', R3, 'decode sweep M=2: 45.6 us'),
    row('at M=2 it loses on the GEMMs (45.6 vs 41.6 us)', R3, 'variants bf16 M=2: grouped-ptr gemms 41.6'),
    row('4096 773.5 -> 760.9 us', R3, 'variants bf16 M=4096: grouped-ptr gemms 773.5 fused 866.7 err 3.9e-03 grouped-tma gemms 760.9'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 952.1440267562866 tma 942.7480101585388'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 885.3440284729004 tma 787.7799868583679'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 815.5959844589233 tma 806.4640164375305'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 885.5879902839661 tma 856.9599986076355'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 816.4920210838318 tma 796.779990196228'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 901.9920229911804 tma 883.2520246505737'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 760.0560188293457 tma 739.4400238990784'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 768.5920000076294 tma 725.9719967842102'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 779.0759801864624 tma 719.3120121955872'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 779.0759801864624 tma 732.3799729347229'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 924.0639805793762 tma 876.8600225448608'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 970.363974571228 tma 914.2559766769409'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 779.2919874191284 tma 729.8759818077087'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 797.3999977111816 tma 748.4239935874939'),
    row('TMA was faster for every bf16 config (by 1-11 %)', R3, 'ptr 934.827983379364 tma 849.1479754447937'),
    row('**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n   against 760.1 us for the best pointer config', R3, R3_TMA_BEST),
    row('**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n   against 760.1 us for the best pointer config', R3, R3_CEIL),
    row('**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n   against 760.1 us for the best pointer config', R3, 'ptr 760.0560188293457'),
    row('**719.3 us = 55.2 % of the measured matmul ceiling** (397 us of FLOPs at 779 TFLOP/s),\n   against 760.1 us for the best pointer config', R3, 'bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6% flops(gemms) 53.6%'),
    row('configs with 8 warps (+0.7-5.6 %)', R3, 'ptr 1218.06800365448 tma 1286.1239910125732'),
    row('configs with 8 warps (+0.7-5.6 %)', R3, 'ptr 1248.196005821228 tma 1257.0680379867554'),
    row('configs with 8 warps (+0.7-5.6 %)', R3, 'ptr 1266.7839527130127 tma 1285.8920097351074'),
    row('configs with 8 warps (+0.7-5.6 %)', R3, 'ptr 1223.6720323562622 tma 1254.9560070037842'),
    row('(55.2 %, TMA sweep)', R3, R3_TMA_BEST),
    row('(55.2 %, TMA sweep)', R3, 'bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6% flops(gemms) 53.6%'),
    row('the shipped config with TMA reaches 53.6 %', R3, 'bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6%'),
    row('(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)', R3, 'variants bf16 M=1: grouped-ptr gemms 24.9'),
    row('(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)', R3, 'read 4280 GB/s'),
    row('(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)', R3, 'decode sweep M=1: 25.1 us'),
    row('(grouped 24.9 us = 71 % of the 2 GiB read-rate floor of\n  17.6 us; the few-token path 25.1 us)', CEIL, "(8 experts' bf16 weights, 75.5 MB)"),
    # Run 4
    row('3007 GB/s**, 71 % of the 2 GiB read rate', R4, R4_CEIL),
    row('| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70 % |', R4, '| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70.2% |'),
    row('| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101 % |', R4, '| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101.1% |'),
    row('| bf16 | 64 | 280.9 | 299.1 | 1.06 | 99 % |', R4, '| bf16 | 64 | 280.9 | 299.1 | 1.06 | 99.4% |'),
    row('| bf16 | 256 | 292.2 | 314.6 | 1.08 | 98 % |', R4, '| bf16 | 256 | 292.2 | 314.6 | 1.08 | 97.6% |'),
    row('| bf16 | 1024 | 343.9 | 394.8 | 1.15 | 83 % |', R4, '| bf16 | 1024 | 343.9 | 394.8 | 1.15 | 83.3% |'),
    row('| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9 % of matmul |', R4, '| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9% | 46.9% | 53.9% |'),
    row('| fp8 [128,128] | 1 | 19.6 | 31.7 | 1.62 | 45 % |', R4, '| fp8_block | 1 | 19.6 | 31.7 | 1.62 | 45.3% |'),
    row('| fp8 [128,128] | 16 | 106.0 | 122.9 | 1.16 | 89 % |', R4, '| fp8_block | 16 | 106.0 | 122.9 | 1.16 | 89.3% |'),
    row('| fp8 [128,128] | 64 | 151.9 | 171.7 | 1.13 | 92 % |', R4, '| fp8_block | 64 | 151.9 | 171.7 | 1.13 | 92.0% |'),
    row('| fp8 [128,128] | 256 | 176.9 | 201.2 | 1.14 | 81 % |', R4, '| fp8_block | 256 | 176.9 | 201.2 | 1.14 | 80.7% |'),
    row('| fp8 [128,128] | 1024 | 228.7 | 278.9 | 1.22 | 63 % |', R4, '| fp8_block | 1024 | 228.7 | 278.9 | 1.22 | 63.1% |'),
    row('| fp8 [128,128] | 4096 | 665.7 | 779.1 | 1.17 | 33 % of fp8 matmul |', R4, '| fp8_block | 4096 | 665.7 | 779.1 | 1.17 | 33.3% |'),
    row('(70-72 % in every run, both paths)', R4, '| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70.2% |'),
    row('(70-72 % in every run, both paths)', R1, '| bf16 | 1 | 25.3 | 36.3 | 1.43 | 71.9% |'),
    row('(70-72 % in every run, both paths)', R2, '| bf16 | 1 | 25.8 | 37.1 | 1.44 | 71.4% |'),
    row('(70-72 % in every run, both paths)', R3, 'variants bf16 M=1: grouped-ptr gemms 24.9'),
    row('(70-72 % in every run, both paths)', R3, 'decode sweep M=1: 25.1 us'),
    row('(70-72 % in every run, both paths)', R3, 'read 4280 GB/s'),
    row('at 2.98 TB/s, 99 % of what a plain torch read', R4, 'bf16 M= 1 gemms 25.3 us'),
    row('at 2.98 TB/s, 99 % of what a plain torch read', R4, R4_CEIL),
    row('to beat the best single read torch does at that size by 6 %', R4, R4_CEIL),
    row('55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)', R3, R3_TMA_BEST),
    row('55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)', R3, 'bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6%'),
    row('55.2 % (best sweep config, run 3), 53.6-53.9 % with the shipped config (runs 3, 4)', R4, '| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9% |'),
    row("51.7 % with\n  exhaustive's pick (tuner run 5, another machine: `gemms_us` 771.6 us against that run's\n  775 TFLOP/s ceiling", 'tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json', '"gemms_us": 771.6400146484375'),
    row("51.7 % with\n  exhaustive's pick (tuner run 5, another machine: `gemms_us` 771.6 us against that run's\n  775 TFLOP/s ceiling", 'tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json', '"matmul_flops_per_s": 774985101430877.2'),
    row("51.7 % with\n  exhaustive's pick (tuner run 5, another machine: `gemms_us` 771.6 us against that run's\n  775 TFLOP/s ceiling", 'tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json', '"roofline_us": 399.023987352848'),
    row("the 52.9 %\n  quoted here before divided GEMM 1 + GEMM 2 timed apart, 750.7 us, by run 3's ceiling", 'tuner_h200_2026-12-02_bf16-6ms-exhaustive_run5.json', '"gemm1_us": 464.302396774292, "gemm2_us": 286.40480041503906'),
    row("the 52.9 %\n  quoted here before divided GEMM 1 + GEMM 2 timed apart, 750.7 us, by run 3's ceiling", R3, R3_CEIL),
    row("the 52.9 %\n  quoted here before divided GEMM 1 + GEMM 2 timed apart, 750.7 us, by run 3's ceiling", R3, 'bf16 M= 4096 gemms 740.3 us fused 819.2 us x1.11 roof(gemms) 53.6% flops(gemms) 53.6%'),
    row('Up from 50-52 % with pointer loads (runs 1-2)', R1, '| bf16 | 4096 | 763.2 | 870.6 | 1.14 | 51.9% |'),
    row('Up from 50-52 % with pointer loads (runs 1-2)', R2, '| bf16 | 4096 | 802.7 | 886.2 | 1.10 | 49.6% |'),
    row('(bf16, 98-101 %)', R4, '| bf16 | 16 | 187.0 | 202.5 | 1.08 | 101.1% |'),
    row('(bf16, 98-101 %)', R4, '| bf16 | 256 | 292.2 | 314.6 | 1.08 | 97.6% |'),
    row('(bf16, 98-101 %)', R4, '| bf16 | 64 | 280.9 | 299.1 | 1.06 | 99.4% |'),
    row('with the shipped config, 36.3 us', R3, 'variants bf16 M=1: grouped-ptr gemms 24.9 fused 36.3'),
    # Runs 5-7: the stream reads, chaining, final numbers
    *[row('One launch: 20.0-20.3 us (3.72-3.78 TB/s, 86 % of\n   the 2 GiB read rate) with 528-2112 programs; 132-264 programs: 24-68 us', src, ev) for src, ev in ((R6, R6_STREAM), (R6, 'read 4378 GB/s'), (R5, 'stream 75.5 MB one launch: 1056 programs block 2048 w4: 20.3 us = 3715 GB/s'), (R6, 'stream 75.5 MB one launch: 132 programs block 2048 w4: 68.5 us'), (R6, 'stream 75.5 MB one launch: 264 programs block 4096 w8: 24.3 us'))],
    row("(50.3 + 25.2 MB, the GEMMs' split): 27.1-27.7 us. So a second launch costs\n   ~7 us of a pure stream", R6, 'stream 75.5 MB as 50.3 + 25.2 MB, unchained: 27.1 us'),
    row("(50.3 + 25.2 MB, the GEMMs' split): 27.1-27.7 us. So a second launch costs\n   ~7 us of a pure stream", R6, 'stream 75.5 MB as 50.3 + 25.2 MB, unchained: 27.7 us'),
    row("(50.3 + 25.2 MB, the GEMMs' split): 27.1-27.7 us. So a second launch costs\n   ~7 us of a pure stream", R6, R6_STREAM),
    row("torch's own sum (24.9 us, run 6)", R6, 'read 4378 GB/s (a 75.5 MB read: 3029 GB/s)'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain bf16 M=64 shipped: unchained gemms 273.5 fused 292.1 err 3.9e-03 chained gemms 271.6'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain fp8_block M=64 shipped: unchained gemms 147.3 fused 167.4 err 4.4e-02 chained gemms 146.0'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain bf16 M=256 shipped: unchained gemms 285.5 fused 309.6 err 3.9e-03 chained gemms 284.2'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain bf16 M=1024 shipped: unchained gemms 338.5 fused 380.7 err 3.9e-03 chained gemms 337.1'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain fp8_block M=256 shipped: unchained gemms 174.3 fused 198.0 err 4.3e-02 chained gemms 173.0'),
    row('larger M left unchained (gains under 1 %)', R6, 'chain fp8_block M=1024 shipped: unchained gemms 226.5 fused 275.7 err 4.4e-02 chained gemms 226.9'),
    row("27.3 us at M=1 (all of GEMM 2's programs fit beside GEMM 1's, so 25 MB of\n   prefetch", R5, 'chain bf16 M=1 shipped: unchained gemms 25.3 fused 37.0 err 3.8e-03 chained-noprefetch gemms 23.9 fused 33.9 err 3.8e-03 chained gemms 27.3'),
    row("27.3 us at M=1 (all of GEMM 2's programs fit beside GEMM 1's, so 25 MB of\n   prefetch", R5, 'stream 75.5 MB as 50.3 + 25.2 MB'),
    row('24.3 vs 23.6 us at M=1, 75.2 vs 71.7 at M=4', R7, 'chain bf16 M=1 shipped: unchained gemms 25.1 fused 36.6 err 3.8e-03 chained gemms 23.6 fused 33.9 err 3.8e-03 chained-preload gemms 24.3'),
    row('24.3 vs 23.6 us at M=1, 75.2 vs 71.7 at M=4', R7, 'chain bf16 M=4 shipped: unchained gemms 73.0 fused 84.9 err 4.0e-03 chained gemms 71.7 fused 82.2 err 4.0e-03 chained-preload gemms 75.2'),
    *[row('bf16 GEMMs 24.4 / 181.9 / 271.9 / 285.7 / 335.5 / 704.5 us at M=1/16/64/256/1024/\n4096 = 70.7 % / 100.8 / 99.5 / 96.8 / 82.8 % of the memory floor and **55.4 % of the matmul\nceiling at M=4096**', R6, ev) for ev in (R6_M1, 'bf16 M= 16 gemms 181.9 us fused 196.3 us x1.08 roof(gemms) 100.8%', 'bf16 M= 64 gemms 271.9 us fused 290.5 us x1.07 roof(gemms) 99.5%', 'bf16 M= 256 gemms 285.7 us fused 307.8 us x1.08 roof(gemms) 96.8%', 'bf16 M= 1024 gemms 335.5 us fused 380.7 us x1.13 roof(gemms) 82.8%', R6_M4096)],
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 1 gemms 18.3 us'),
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 4096 gemms 647.1 us'),
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 16 gemms 100.6 us'),
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 64 gemms 147.4 us'),
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 256 gemms 174.0 us'),
    row('fp8 block: 18.3 / 100.6 /\n147.4 / 174.0 / 224.9 / 647.1 us', R6, 'fp8_block M= 1024 gemms 224.9 us'),
    row('M=1 24.2 us = 73.5 %,\nM=4096 755.7 us = 52.1 %', R7, R7_M1),
    row('M=1 24.2 us = 73.5 %,\nM=4096 755.7 us = 52.1 %', R7, R7_M4096),
    row('23.1 us = 74.7 %', R6, "sweep bf16 M=1: best of 27 23.1 us {'BLOCK_SIZE_M': 16, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 64, 'GROUP_SIZE_M': 1, 'num_warps': 4, 'num_stages': 5}"),
    row('23.1 us = 74.7 %', R6, 'read 4378 GB/s'),
    row('23.1 us = 74.7 %', R6, R6_M1),
    row('(70.7-74.7 % over runs 5-7; was 70-72 %)', R6, R6_M1),
    row('(70.7-74.7 % over runs 5-7; was 70-72 %)', R6, 'sweep bf16 M=1: best of 27 23.1 us'),
    row('(70.7-74.7 % over runs 5-7; was 70-72 %)', R4, '| bf16 | 1 | 25.3 | 36.9 | 1.45 | 70.2% |'),
    row('(70.7-74.7 % over runs 5-7; was 70-72 %)', R1, '| bf16 | 1 | 25.3 | 36.3 | 1.43 | 71.9% |'),
    row('chained GEMMs (23.1-24.4 us) already beat a plain two-launch stream of the same bytes\n  (26.8-27.7 us); only a one-launch stream (20 us) is faster', R6, 'sweep bf16 M=1: best of 27 23.1 us'),
    row('chained GEMMs (23.1-24.4 us) already beat a plain two-launch stream of the same bytes\n  (26.8-27.7 us); only a one-launch stream (20 us) is faster', R6, R6_M1),
    row('chained GEMMs (23.1-24.4 us) already beat a plain two-launch stream of the same bytes\n  (26.8-27.7 us); only a one-launch stream (20 us) is faster', R6, 'stream 75.5 MB as 50.3 + 25.2 MB, chained: 26.8 us'),
    row('chained GEMMs (23.1-24.4 us) already beat a plain two-launch stream of the same bytes\n  (26.8-27.7 us); only a one-launch stream (20 us) is faster', R6, 'stream 75.5 MB as 50.3 + 25.2 MB, unchained: 27.7 us'),
    row('chained GEMMs (23.1-24.4 us) already beat a plain two-launch stream of the same bytes\n  (26.8-27.7 us); only a one-launch stream (20 us) is faster', R6, R6_STREAM),
    row('met on one machine (55.4 %, run 6), 52.1-53.9 % on others', R6, R6_M4096),
    row('met on one machine (55.4 %, run 6), 52.1-53.9 % on others', R7, R7_M4096),
    row('met on one machine (55.4 %, run 6), 52.1-53.9 % on others', R4, '| bf16 | 4096 | 738.6 | 849.8 | 1.15 | 53.9% |'),
    row("(704.5 us on run 6's card, 755.7 us on run 7's: 7 %)", R6, R6_M4096),
    row("(704.5 us on run 6's card, 755.7 us on run 7's: 7 %)", R7, R7_M4096),
    # Runs 8-9: one launch for both GEMMs
    row('the 20 us a\n    one-launch stream reaches', R6, R6_STREAM),
    row('| 1 | 17.3 | 28.1 (61.6 %), call 29.2 | 29.3 (59.3 %), call 30.6 | 23.4 / 23.5 (73.8 / 74.0 %), call 33.7 / 33.9 |', R8, R8_M1),
    row('| 1 | 17.3 | 28.1 (61.6 %), call 29.2 | 29.3 (59.3 %), call 30.6 | 23.4 / 23.5 (73.8 / 74.0 %), call 33.7 / 33.9 |', R9, R9_M1),
    *[row('10-13 % faster on the one-launch path at M=1 (no alignment, activation or extra launches:\n    29.2 vs 33.7 us in run 8, 30.6 vs 33.9 in run 9), which is what a server at batch 1 runs,\n    and under 6 % faster at M=2 and 4', src, ev) for src, ev in ((R8, R8_M1), (R9, R9_M1), (R8, 'decode vs grouped M=2 (floor 34.0 us): decode gemms 46.6 (73.1%) fused 47.6 err 2.3e-03 grouped gemms 39.7 (85.7%) fused 50.4'), (R8, 'decode vs grouped M=4 (floor 64.8 us): decode gemms 79.8 (81.3%) fused 81.6 err 2.4e-03 grouped gemms 71.5 (90.7%) fused 82.1'), (R9, 'decode vs grouped M=2 (floor 34.2 us): decode gemms 47.6 (71.9%) fused 49.0 err 2.8e-03 grouped gemms 39.8 (86.0%) fused 50.3'), (R9, 'decode vs grouped M=4 (floor 65.2 us): decode gemms 75.1 (86.8%) fused 76.9 err 2.9e-03 grouped gemms 70.6 (92.3%) fused 81.1'))],
    # Run 10
    row('`results/pytest_h200_2026-12-03_run10.txt` (41 passed)', 'pytest_h200_2026-12-03_run10.txt', '41 passed, 69 deselected in 56.57s'),
    row('| 1 | 17.2 | 26.4 (65.4 %) / **27.3** | 31.9 | **23.4 (73.8 %)** / 33.6 |', R10, R10_M1),
    row('took the one-launch GEMM part from 29.3 to 26.4 us at M=1', R9, R9_M1),
    row('took the one-launch GEMM part from 29.3 to 26.4 us at M=1', R10, R10_M1),
    row('grouped GEMMs (23.4 us), but the **whole call** at M=1 is now 27.3 us against 33.6 (-19 %)', R10, R10_M1),
    row('its picks beat the shipped configs by 10-20 % there', 'tuner_h200_2026-12-03_bf16-small-m_run10.txt', '4 73.81 3 0.7 | 74.26 82.21 0.903'),
    row('its picks beat the shipped configs by 10-20 % there', 'tuner_h200_2026-12-03_bf16-small-m_run11.txt', '2 44.07 86 4.1 | 44.11 55.02 0.802'),
    row('its picks beat the shipped configs by 10-20 % there', 'tuner_h200_2026-12-03_bf16-small-m_run10.txt', '2 43.41 27 3.8 | 44.07 54.28 0.812'),
    row('its picks beat the shipped configs by 10-20 % there', 'tuner_h200_2026-12-03_bf16-small-m_run11.txt', '4 73.87 0 1.8 | 73.81 83.20 0.887'),
    row('26.4 us with its best config, 30.7 us\nwith the shipped one', R10, R10_M1),
    row('stay at\n73.8-74.0 % of the floor in runs 8-10 (best single run 74.7 %, run 6)', R8, R8_M1),
    row('stay at\n73.8-74.0 % of the floor in runs 8-10 (best single run 74.7 %, run 6)', R9, R9_M1),
    row('stay at\n73.8-74.0 % of the floor in runs 8-10 (best single run 74.7 %, run 6)', R10, R10_M1),
    row('stay at\n73.8-74.0 % of the floor in runs 8-10 (best single run 74.7 %, run 6)', R6, 'sweep bf16 M=1: best of 27 23.1 us'),
    row('stay at\n73.8-74.0 % of the floor in runs 8-10 (best single run 74.7 %, run 6)', R6, R6_M1),
    # Run 11
    row('`results/pytest_h200_2026-12-03_run11.txt` (62 passed', 'pytest_h200_2026-12-03_run11.txt', '62 passed, 74 deselected in 52.42s'),
    row('(20 us for 75.5 MB, run 6)', R6, R6_STREAM),
    row('| 1 | 17.5 | 26.0 (67.5 %) | 27.3 (64.2 %) / 28.4 | **23.6 (74.3 %)** / 33.9 |', R11, R11_M1),
    *[row('the M=1 call 8 % faster than the ticket kernel (26.0 vs 28.4 us)\n    and 23 % faster than the grouped path; it is 2 % slower at M=2 and 2 % faster at M=4.\n    Its GEMM part is still slower than the two chained grouped GEMMs (26.0 vs 23.6 us)', R11, ev) for ev in (R11_M1, 'decode vs grouped M=2 (floor 34.5 us): decode-slice gemms 45.4 (75.9%) fused 45.5 err 2.3e-03 decode-ticket gemms 43.2 (79.9%) fused 44.6', 'decode vs grouped M=4 (floor 65.7 us): decode-slice gemms 74.6 (88.0%) fused 74.8 err 2.4e-03 decode-ticket gemms 74.9 (87.6%) fused 76.3')],
    row('(grouped GEMMs 74.3 %, slice 67.5 %).\nM=4096: 730.3 us = **53.5 % of matmul, missed** on this machine (55.4 % best, run 6).\nM=16-256 98-102 %', R11, R11_M1),
    row('(grouped GEMMs 74.3 %, slice 67.5 %).\nM=4096: 730.3 us = **53.5 % of matmul, missed** on this machine (55.4 % best, run 6).\nM=16-256 98-102 %', R11, 'bf16 M= 4096 gemms 730.3 us fused 827.8 us x1.13 roof(gemms) 53.5%'),
    row('(grouped GEMMs 74.3 %, slice 67.5 %).\nM=4096: 730.3 us = **53.5 % of matmul, missed** on this machine (55.4 % best, run 6).\nM=16-256 98-102 %', R6, R6_M4096),
    row('(grouped GEMMs 74.3 %, slice 67.5 %).\nM=4096: 730.3 us = **53.5 % of matmul, missed** on this machine (55.4 % best, run 6).\nM=16-256 98-102 %', R11, 'bf16 M= 16 gemms 181.9 us fused 196.5 us x1.08 roof(gemms) 102.3%'),
    row('(grouped GEMMs 74.3 %, slice 67.5 %).\nM=4096: 730.3 us = **53.5 % of matmul, missed** on this machine (55.4 % best, run 6).\nM=16-256 98-102 %', R11, 'bf16 M= 256 gemms 285.8 us fused 308.2 us x1.08 roof(gemms) 98.2%'),
    # Run 12
    row('| 1 | 17.8 | 26.1 (68.0 %) | 27.4 / 28.4 | **23.6 (75.1 %)** / 34.1 |', R12, R12_M1),
    *[row("the slice kernel's M=1 call is 8 % faster than the ticket kernel's,\n2 % faster at M=4, 2 % slower at M=2. The grouped GEMMs at M=1 read **75.1 %** of the floor\nhere against 74.3 % in run 11 with the same 23.6 us", src, ev) for src, ev in ((R12, R12_M1), (R12, 'decode vs grouped M=2 (floor 35.0 us): decode-slice gemms 45.3 (77.3%) fused 45.3 err 2.3e-03 decode-ticket gemms 43.2 (81.1%) fused 44.5'), (R12, 'decode vs grouped M=4 (floor 66.6 us): decode-slice gemms 74.8 (89.1%) fused 74.7 err 2.4e-03 decode-ticket gemms 74.6 (89.3%) fused 76.0'), (R11, R11_M1))],
    row('across runs\n(73.8-75.1 %)', R8, R8_M1),
    row('across runs\n(73.8-75.1 %)', R12, R12_M1),
    # Run 18
    row('| 4096 | shipped (s4) | 768.6 (51.5 %) | 757.8 | 784.8 | **718.8 (55.1 %)** | 757.1 |', R18, R18_S4),
    row('| 4096 | same, s3 | 772.7 (51.3 %) | 751.2 | 767.4 | **706.8 (56.0 %)** | 758.0 |', R18, R18_S3),
    row('Whole calls at M=4096: 862.4 -> 840.9 us (shipped), 862.5 -> 826.8 us (s3)', R18, R18_S4),
    row('Whole calls at M=4096: 862.4 -> 840.9 us (shipped), 862.5 -> 826.8 us (s3)', R18, R18_S3),
    row('GEMMs reach 55-56 % of the matmul ceiling in this run', R18, R18_S4),
    row('GEMMs reach 55-56 % of the matmul ceiling in this run', R18, R18_S3),
    row('(few-token path, shipped config) is 31.1 us', R18, 'bf16 M= 1 gemms 31.1 us'),
    row("the tuner's\npick is 28.1 us for the whole call, run 18's tuner smoke", 'tuner_h200_2026-12-03_bf16-smoke_run18.json', '"time_us": 28.139200806617737'),
    # Run 20
    row('| 1 | 31.4 | 32.3 | 1.03 | 56.3 % | |', R20, '| bf16 | 1 | 31.4 | 32.3 | 1.03 | 56.3% |'),
    row('| 16 | 182.1 | 196.6 | 1.08 | 103.3 % | |', R20, '| bf16 | 16 | 182.1 | 196.6 | 1.08 | 103.3% |'),
    row('| 64 | 274.8 | 292.1 | 1.06 | 101.1 % | |', R20, '| bf16 | 64 | 274.8 | 292.1 | 1.06 | 101.1% |'),
    row('| 256 | 286.1 | 308.4 | 1.08 | 99.1 % | |', R20, '| bf16 | 256 | 286.1 | 308.4 | 1.08 | 99.1% |'),
    row('| 1024 | 342.3 | 383.8 | 1.12 | 83.3 % | 28.8 % |', R20, '| bf16 | 1024 | 342.3 | 383.8 | 1.12 | 83.3% | 74.3% | 28.8% |'),
    *[row("the main tables of runs 4-18 read 52.1-55.4 %,\nrun 6's 55.4 % on another machine, and run 18's side by side 51.3-51.5 %", src, ev) for src, ev in ((R7, R7_M4096), (R6, R6_M4096), (R18, R18_S4), (R18, R18_S3))],
    row('found 779.0 us for the whole call at M=4096 in run 19', 'tuner_h200_2026-12-03_bf16-6ms-both_run19.txt', '[tune] M=4096: 1244 timed, 536 pruned, 0 failed of 1240 candidates; best 778.95 us'),
    row('832.7 us before persistence (run 15)', 'tuner_h200_2026-12-03_bf16-6ms-both_run15.txt', '[tune] M=4096: 1244 timed, 536 pruned, 0 failed of 1240 candidates; best 832.66 us'),
    row('alone read 73.8-75.1 % (runs 8-12)', R8, R8_M1),
    row('alone read 73.8-75.1 % (runs 8-12)', R12, R12_M1),
    row('whose one-launch kernels reach 64-68 % with their best configs (runs 11-12)', R11, R11_M1),
    row('whose one-launch kernels reach 64-68 % with their best configs (runs 11-12)', R12, R12_M1),
    row('(2985 GB/s here, 70 % of the large-read ceiling)', R20, 'read 4267 GB/s (a 75.5 MB read: 2985 GB/s)'),
    # Issue 23 item 3
    *[row('fp8 M=1: builtin GEMMs 17.2 us vs vLLM\n  16.1, whole call 29.5 vs 20.8, so 12.3 us outside the GEMMs against 4.7', f'{TVK}/tuner_vllm_kernel_h200_fp8.json', ev) for ev in ('"kernel": "builtin", "path": "grouped", "call_us": 29.45919930934906, "call_spread": 0.002525527151756316, "gemms_us": 17.17439964413643', '"kernel": "vllm", "path": "auto", "call_us": 20.814400166273117, "call_spread": 0.0038627174408925346, "gemms_us": 16.071999818086624')],
    *[row('GEMMs 23.4 vs 25.4 (builtin faster) but call 33.3 vs 28.7 (9.9 us outside vs 3.3)', f'{TVK}/tuner_vllm_kernel_h200_bf16.json', ev) for ev in ('"kernel": "builtin", "path": "grouped", "call_us": 33.3296000957489, "call_spread": 0.003012312807784428, "gemms_us": 23.38079959154129', '"kernel": "vllm", "path": "auto", "call_us": 28.708800673484802, "call_spread": 0.0039291062303573885, "gemms_us": 25.356800854206085')],
    row('28.46 us for vLLM at M=1, the builtin 0.879 of it (was 1.156\n  before the change, in the same run)', f'{BVV}/builtin_vs_vllm_h200_bf16.txt', '1 28.46 | 0.879 1.156'),
    row('(32.9 ->\n  25.0 us, more than predicted', f'{BVV}/builtin_vs_vllm_h200_bf16.txt', '1 28.46 | 0.879 1.156'),
    *[row('(28.2 / 54.1 / 90.0 against\n  25.7 / 40.8 / 72.9 us', PATHS, ev) for ev in ('"grouped_us": 25.676800310611725, "decode_us": 28.169600665569305', '"grouped_us": 40.76479971408844, "decode_us": 54.09599840641022', '"grouped_us": 72.87519872188568, "decode_us": 90.00479876995087')],
]
# fmt: on
