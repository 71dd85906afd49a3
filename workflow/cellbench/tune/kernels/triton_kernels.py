"""The Triton bodies of the builtin fused-MoE kernel's grouped path: the grouped GEMM,
SiLU-and-mul, fp8 quantisation and the top-k sum (the few-token path's are in
``triton_decode``). Launched by ``fused_moe`` (the launch policy and the launchers).

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (Hopper and later; Triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: kernels are never chained
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """(row block, column block) of a tile index in grouped order: GROUP_SIZE_M row blocks
    take the same weight columns one after another, while those are hot in L2."""
    in_group = GROUP_SIZE_M * num_pid_n
    first_m = (tile // in_group) * GROUP_SIZE_M
    group_rows = min(num_pid_m - first_m, GROUP_SIZE_M)
    return first_m + ((tile % in_group) % group_rows), (tile % in_group) // group_rows


@triton.jit
def _gemm_tile(
    pid_m,
    pid_n,
    a_ptr,
    b_ptr,
    b_desc,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    N,
    K,
    num_valid,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    A_DIV: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    B_DESC: tl.constexpr,
    WAIT_PREV: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    NAIVE: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False,
    B_SCALE_SCALAR: tl.constexpr = False,
):
    """One (BLOCK_SIZE_M x BLOCK_SIZE_N) tile of a grouped GEMM (see `_moe_gemm_kernel`).

    NAIVE: no alignment; row block pid_m is pair pid_m alone (its other rows are padding) and
    expert_ids_ptr points at the flat topk_ids. SWAP_AB: the tile is computed transposed,
    (weight tile) @ (activation rows)^T, so that the wide weight side fills the MMA's M
    dimension when BLOCK_SIZE_M is small. B_SCALE_SCALAR (block-quantised, GROUP_N a multiple
    of BLOCK_SIZE_N): the tile's columns share one weight scale per K group, loaded as a
    scalar and folded into the rows' activation scale."""
    rows = tl.arange(0, BLOCK_SIZE_M)
    if NAIVE:
        pair = tl.where(rows == 0, pid_m, num_valid).to(tl.int64)
    else:
        pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + rows.to(tl.int64)).to(tl.int64)
    row_ok = pair < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_bn = offs_n % N  # wrap so weight loads need no column mask; stores are masked
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_row = pair // A_DIV
    if SWAP_AB:  # A as (K, M) and B as (N, K) tiles
        a_ptrs = a_ptr + a_row[None, :] * stride_am + offs_k[:, None] * stride_ak
        b_ptrs = (b_ptr + expert * stride_be + offs_bn[:, None] * stride_bn
                  + offs_k[None, :] * stride_bk)  # fmt: skip
    else:
        a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = (b_ptr + expert * stride_be + offs_bn[None, :] * stride_bn
                  + offs_k[:, None] * stride_bk)  # fmt: skip
    if WAIT_PREV:
        gdc_wait()
    if QUANT == 2:
        as_ptrs = a_scale_ptr + a_row * stride_asm
        if B_SCALE_SCALAR:
            bs_col = pid_n * BLOCK_SIZE_N // GROUP_N
            bs_ptrs = b_scale_ptr + expert * stride_bse + bs_col * stride_bsn
        else:
            bs_ptrs = b_scale_ptr + expert * stride_bse + (offs_bn // GROUP_N) * stride_bsn

    if SWAP_AB:
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    b_row = (expert * N + pid_n * BLOCK_SIZE_N).to(tl.int32)
    for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_ok = offs_k < K - kb * BLOCK_SIZE_K
        if SWAP_AB:
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[None, :], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=row_ok[None, :] & k_ok[:, None], other=0.0)
            if B_DESC:
                b = b_desc.load([b_row, kb * BLOCK_SIZE_K])
            elif EVEN_K:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=k_ok[None, :], other=0.0)
        else:
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if B_DESC:
                b = b_desc.load([b_row, kb * BLOCK_SIZE_K]).T
            elif EVEN_K:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if QUANT == 2:
            kg = (kb * BLOCK_SIZE_K) // GROUP_K
            a_s = tl.load(as_ptrs + kg * stride_ask, mask=row_ok, other=0.0)
            b_s = tl.load(bs_ptrs + kg * stride_bsk)
            if SWAP_AB and B_SCALE_SCALAR:
                acc += tl.dot(b, a) * (a_s * b_s)[None, :]
            elif SWAP_AB:
                acc += tl.dot(b, a) * b_s[:, None] * a_s[None, :]
            elif B_SCALE_SCALAR:
                acc += tl.dot(a, b) * (a_s * b_s)[:, None]
            else:
                acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        elif SWAP_AB and IEEE:
            acc = tl.dot(b, a, acc, input_precision="ieee")
        elif SWAP_AB:
            acc = tl.dot(b, a, acc)
        elif IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if SWAP_AB:
        acc = tl.trans(acc)

    if QUANT == 1:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert * stride_bse))
    if MUL_ROUTED_WEIGHT:
        w = tl.load(topk_weights_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = c_ptr + pair[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))


@triton.jit
def _moe_gemm_kernel(
    a_ptr,
    b_ptr,
    b_desc,
    c_ptr,
    a_scale_ptr,
    b_scale_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    total_ptr,
    N,
    K,
    EM,
    num_valid,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr,
    A_DIV: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    QUANT: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    B_DESC: tl.constexpr,
    LAUNCH_NEXT: tl.constexpr,
    WAIT_PREV: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    FLATTEN: tl.constexpr,
    NAIVE: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False,
    B_SCALE_SCALAR: tl.constexpr = False,
):
    """C[rows of one expert] = A[rows] @ B[e]^T for one (BLOCK_SIZE_M x BLOCK_SIZE_N) tile.

    A rows are pair indices // A_DIV (A_DIV = topk for GEMM 1, whose A is per token; 1 for
    GEMM 2, whose A is per pair). B is (E, N, K). C is written at the pair index.
    With B_DESC the B tiles come through b_desc, a tensor descriptor over B viewed as
    (E*N, K) (TMA on Hopper); a tile past N reads the next expert's rows, whose columns the
    masked store drops.

    Chaining (programmatic dependent launch, see `_chain`): LAUNCH_NEXT lets the next kernel's
    programs start as soon as every program here has started; WAIT_PREV (this kernel launched
    early) waits for the previous kernel before its loop. Before the wait it reads only the
    alignment, which a kernel at least two launches back wrote.

    PERSISTENT: each program (one per SM) loops over the tiles, the same tiles in about the
    same order, so that a tile's loads can start while the previous tile writes its output:
    GEMM 2's short reduction (K = N of the model) leaves little loop to hide a tile's start
    and store behind. FLATTEN asks Triton to pipeline across the tile loop. Never chained.

    NAIVE, SWAP_AB, B_SCALE_SCALAR: see `_gemm_tile`. With NAIVE, EM is pairs * BLOCK_SIZE_M
    and every row block is used (total_ptr is not read).
    """
    if PERSISTENT:
        if NAIVE:
            num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
        else:
            num_pid_m = tl.cdiv(tl.load(total_ptr), BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        tiles = num_pid_m * num_pid_n
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_SIZE_M)
            _gemm_tile(
                pid_m,
                pid_n,
                a_ptr,
                b_ptr,
                b_desc,
                c_ptr,
                a_scale_ptr,
                b_scale_ptr,
                topk_weights_ptr,
                sorted_ids_ptr,
                expert_ids_ptr,
                N,
                K,
                num_valid,
                stride_am,
                stride_ak,
                stride_be,
                stride_bn,
                stride_bk,
                stride_cm,
                stride_cn,
                stride_asm,
                stride_ask,
                stride_bse,
                stride_bsn,
                stride_bsk,
                GROUP_N,
                GROUP_K,
                A_DIV,
                MUL_ROUTED_WEIGHT,
                QUANT,
                EVEN_K,
                IEEE,
                B_DESC,
                False,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N,
                BLOCK_SIZE_K,
                NAIVE,
                SWAP_AB,
                B_SCALE_SCALAR,
            )
    else:
        pid = tl.program_id(0)
        if LAUNCH_NEXT:
            gdc_launch_dependents()
        num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
        pid_m, pid_n = _tile_coords(pid, num_pid_m, tl.cdiv(N, BLOCK_SIZE_N), GROUP_SIZE_M)
        if not NAIVE:
            if pid_m * BLOCK_SIZE_M >= tl.load(total_ptr):
                return
        _gemm_tile(
            pid_m,
            pid_n,
            a_ptr,
            b_ptr,
            b_desc,
            c_ptr,
            a_scale_ptr,
            b_scale_ptr,
            topk_weights_ptr,
            sorted_ids_ptr,
            expert_ids_ptr,
            N,
            K,
            num_valid,
            stride_am,
            stride_ak,
            stride_be,
            stride_bn,
            stride_bk,
            stride_cm,
            stride_cn,
            stride_asm,
            stride_ask,
            stride_bse,
            stride_bsn,
            stride_bsk,
            GROUP_N,
            GROUP_K,
            A_DIV,
            MUL_ROUTED_WEIGHT,
            QUANT,
            EVEN_K,
            IEEE,
            B_DESC,
            WAIT_PREV,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            BLOCK_SIZE_K,
            NAIVE,
            SWAP_AB,
            B_SCALE_SCALAR,
        )


@triton.jit
def _silu_mul_kernel(
    in_ptr,
    out_ptr,
    amax_ptr,
    N,
    stride_in,
    stride_out,
    TRACK_AMAX: tl.constexpr,
    CHAINED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out = silu(gate) * up per pair row (gate = first N columns, up = next N); with
    TRACK_AMAX also folds the block's max |out| into *amax_ptr (for per-tensor fp8).
    CHAINED: launched early (see `_chain`): let the next kernel start, then wait for GEMM 1."""
    if CHAINED:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(in_ptr + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(in_ptr + row * stride_in + N + cols, mask=ok, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=ok)
    if TRACK_AMAX:
        tl.atomic_max(amax_ptr, tl.max(tl.abs(y), axis=0))


@triton.jit
def _group_quant_kernel(
    in_ptr,
    q_ptr,
    s_ptr,
    n_cols,
    stride_in,
    stride_q,
    stride_sm,
    SILU_MUL: tl.constexpr,
    FP8_MAX: tl.constexpr,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    LAUNCH_NEXT: tl.constexpr = False,
    WAIT_PREV: tl.constexpr = False,
):
    """Dynamic fp8 quantisation per row and GROUP-wide column group, GROUPS groups per
    program; with SILU_MUL the input is GEMM 1's (gate | up) row and silu(gate) * up is
    quantised (activation and quantisation in one pass). LAUNCH_NEXT / WAIT_PREV: chained
    (see `_chain`): let the next kernel start early / wait for the previous one first."""
    if LAUNCH_NEXT:
        gdc_launch_dependents()
    if WAIT_PREV:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = cols < n_cols
    x = tl.load(in_ptr + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
    if SILU_MUL:
        u = tl.load(in_ptr + row * stride_in + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
        x = x / (1.0 + tl.exp(-x)) * u
    s = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / FP8_MAX
    q = tl.clamp(x / s[:, None], -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + grp, s, mask=grp * GROUP < n_cols)


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.atomic_max(amax_ptr, tl.max(tl.abs(x), axis=0))


@triton.jit
def _tensor_quant_kernel(
    x_ptr, q_ptr, amax_ptr, s_ptr, numel, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr
):
    """Quantise a contiguous tensor with one dynamic scale amax / FP8_MAX (also stored)."""
    s = tl.maximum(tl.load(amax_ptr), 1e-10) / FP8_MAX
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    q = tl.clamp(x / s, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=ok)
    if tl.program_id(0) == 0:
        tl.store(s_ptr, s)


@triton.jit
def _sum_topk_kernel(
    in_ptr,
    out_ptr,
    K,
    stride_in,
    stride_out,
    TOPK: tl.constexpr,
    TOPK_P: tl.constexpr,
    CHAINED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[t] = sum over k of in[t * TOPK + k] (fp32 accumulation). CHAINED: launched early
    (see `_chain`), waits for GEMM 2 first."""
    if CHAINED:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ks = tl.arange(0, TOPK_P)
    m = (ks[:, None] < TOPK) & (cols[None, :] < K)
    x = tl.load(in_ptr + (t * TOPK + ks[:, None]) * stride_in + cols[None, :], mask=m, other=0.0)
    y = tl.sum(x.to(tl.float32), axis=0)
    tl.store(out_ptr + t * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=cols < K)
