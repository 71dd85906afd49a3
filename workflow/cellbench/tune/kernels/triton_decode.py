"""The Triton bodies of the few-token ("decode") path of the builtin fused-MoE kernel: both
GEMMs of a call in one launch (``_moe_decode_kernel``, with a ticket and sync words) or one
launch per output slice (``_moe_decode_slice_kernel``). Launched by ``fused_moe``.

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cellbench.tune.kernels.triton_kernels import gdc_launch_dependents


@triton.jit
def _gate_up_slice(
    x_row_ptr,
    w1_expert_ptr,
    weight,
    offs_n,
    N,
    K,
    stride_w1n,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    GATE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """GEMM 1 of one (token, expert) pair for the intermediate columns offs_n, with the
    epilogue: silu(x . W1g[cols]) * (x . W1u[cols]) * weight, fp32, (GATE_N,). Columns past N
    read wrapped rows (no mask on the weight loads); callers mask them. The products are
    tensor-core dots with the token's row as row 0 of a 16-row A tile (rows 1-15 zero), so
    the weight tiles stream through the multi-stage pipeline as in the grouped kernel, which
    plain loads and FMAs did not get (run 8 in benchmarks/NOTES-kernel.md)."""
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    rows = tl.arange(0, 16)
    live = rows[:, None] == 0
    offs_wn = offs_n % N
    x_ptrs = x_row_ptr + rows[:, None] * 0 + offs_k[None, :]
    g_ptrs = w1_expert_ptr + offs_wn[None, :] * stride_w1n + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_w1n
    acc_g = tl.zeros((16, GATE_N), dtype=tl.float32)
    acc_u = tl.zeros((16, GATE_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(x_ptrs, mask=live, other=0.0)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:
            k_ok = offs_k < K - kb * BLOCK_SIZE_K
            a = tl.load(x_ptrs, mask=live & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        if IEEE:
            acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
        x_ptrs += BLOCK_SIZE_K
        g_ptrs += BLOCK_SIZE_K
        u_ptrs += BLOCK_SIZE_K
    gate = tl.sum(acc_g, axis=0)  # rows 1-15 are zero
    up = tl.sum(acc_u, axis=0)
    h = gate / (1.0 + tl.exp(-gate)) * up * weight
    return h


@triton.jit
def _moe_decode_kernel(
    x_ptr,
    w1_ptr,
    w2_ptr,
    h_ptr,
    out_ptr,
    sync_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    N,
    K,
    num_pairs,
    stride_xm,
    stride_w1e,
    stride_w1n,
    stride_w2e,
    stride_w2k,
    stride_hm,
    stride_om,
    TOPK: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    IEEE: tl.constexpr,
    LAUNCH_NEXT: tl.constexpr,
    BACKOFF: tl.constexpr,
    GATE_N: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """Both GEMMs and the activation of a few-token call in one launch (the few-token path).

    Programs take tickets in start order from sync[0]. The first pairs * cdiv(N, GATE_N)
    tickets are GEMM 1 tiles: h[pair, cols] = silu(x . W1g[e, cols]) * (x . W1u[e, cols]) *
    routing weight for GATE_N intermediate columns (2 * GATE_N weight rows), then
    sync[2 + pair] += 1 (release). The rest are GEMM 2 tiles: out[pair, rows] =
    W2[e][rows, :] @ h[pair] for BLOCK_SIZE_N output rows, once every GEMM 1 tile of that pair
    has counted in. A GEMM 2 program only waits on tickets handed out before its own, i.e. on
    programs already running that never wait, so the grid cannot deadlock, and GEMM 2 of the
    first pairs may overlap GEMM 1 of the last (no second launch). The last program to finish
    zeroes sync for the next call. The reductions stream BLOCK_SIZE_K at a time.

    The products are tensor-core dots with the pair's row as row 0 of a 16-row A tile (the
    other rows zero): the weight tiles then stream through the same multi-stage pipeline as
    in the grouped kernel, which plain loads and FMAs did not get (run 8 in
    benchmarks/NOTES-kernel.md).
    """
    if LAUNCH_NEXT:
        gdc_launch_dependents()
    nb1 = tl.cdiv(N, GATE_N)
    first = num_pairs * nb1
    total = first + num_pairs * tl.cdiv(K, BLOCK_SIZE_N)
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    rows = tl.arange(0, 16)
    live = rows[:, None] == 0  # row 0 carries the pair; rows 1-15 pad the tile to 16
    if ticket < first:
        pair = (ticket // nb1).to(tl.int64)
        offs_n = (ticket % nb1) * GATE_N + tl.arange(0, GATE_N)
        expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
        h = _gate_up_slice(
            x_ptr + (pair // TOPK) * stride_xm, w1_ptr + expert * stride_w1e,
            tl.load(topk_weights_ptr + pair), offs_n, N, K, stride_w1n,
            EVEN_K, IEEE, GATE_N, BLOCK_SIZE_K,
        )  # fmt: skip
        tl.store(h_ptr + pair * stride_hm + offs_n, h.to(h_ptr.dtype.element_ty), mask=offs_n < N)
        tl.debug_barrier()  # every thread's part of h is written before the count goes up
        tl.atomic_add(sync_ptr + 2 + pair, 1, sem="release")
    else:
        t2 = ticket - first
        nb2 = tl.cdiv(K, BLOCK_SIZE_N)
        pair = (t2 // nb2).to(tl.int64)
        offs_o = (t2 % nb2) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        offs_wo = offs_o % K
        expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
        w2_ptrs = w2_ptr + expert * stride_w2e + offs_wo[None, :] * stride_w2k + offs_k[:, None]
        h_ptrs = h_ptr + pair * stride_hm + rows[:, None] * 0 + offs_k[None, :]
        count = sync_ptr + 2 + pair
        while tl.load(count, volatile=True) < nb1:
            if BACKOFF:  # sleep between polls: spinning programs share the SM with streaming ones
                tl.inline_asm_elementwise(
                    "nanosleep.u32 $1; mov.u32 $0, $1;", "=r,r", [nb1 * 0 + 128],
                    dtype=tl.int32, is_pure=False, pack=1,
                )  # fmt: skip
        # The acquire orders the h loads after the producers' release. `seen` (always nb1
        # here) masks those loads so that the compiler keeps the atomic.
        seen = tl.atomic_add(count, 0, sem="acquire")
        h_live = live & (offs_k[None, :] < tl.where(seen >= nb1, BLOCK_SIZE_K, 0))
        acc = tl.zeros((16, BLOCK_SIZE_N), dtype=tl.float32)
        for cb in range(0, tl.cdiv(N, BLOCK_SIZE_K)):
            if EVEN_N:
                a = tl.load(h_ptrs, mask=h_live, other=0.0, cache_modifier=".cg")
                w = tl.load(w2_ptrs)
            else:
                c_ok = offs_k < N - cb * BLOCK_SIZE_K
                a = tl.load(h_ptrs, mask=h_live & c_ok[None, :], other=0.0, cache_modifier=".cg")
                w = tl.load(w2_ptrs, mask=c_ok[:, None], other=0.0)
            if IEEE:
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
            h_ptrs += BLOCK_SIZE_K
            w2_ptrs += BLOCK_SIZE_K
        y = tl.sum(acc, axis=0)
        o_ptrs = out_ptr + pair * stride_om + offs_o
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=offs_o < K)
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel") == total - 1:
        # Last one out: every other program is done with sync; zero it for the next call.
        tl.store(sync_ptr, 0)
        tl.store(sync_ptr + 1, 0)
        offs_p = tl.arange(0, 128)
        for p0 in range(0, num_pairs, 128):
            tl.store(sync_ptr + 2 + p0 + offs_p, 0, mask=p0 + offs_p < num_pairs)


@triton.jit
def _moe_decode_slice_kernel(
    x_ptr,
    w1_ptr,
    w2_ptr,
    acc_ptr,
    count_ptr,
    out_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    N,
    K,
    stride_xm,
    stride_w1e,
    stride_w1n,
    stride_w2e,
    stride_w2k,
    stride_om,
    TOPK: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    GATE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
):
    """The whole few-token call in one launch, split along the intermediate dimension.

    Program (pair, slice) computes h = silu(x . W1g[e, cols]) * (x . W1u[e, cols]) * routing
    weight for GATE_N intermediate columns, then that slice's share of GEMM 2,
    W2[e][:, cols] @ h, BLOCK_SIZE_K output rows at a time, added atomically into the token's
    fp32 row acc[token]. No program waits for another: every weight byte is read once, by the
    program that owns its columns. The last program to count in for a token (count[token])
    reads the token's row from acc, writes it in the
    output dtype and zeroes the row and the count: the sum over top-k needs no kernel of its
    own.

    The sum's order varies from run to run (atomics), so results agree to rounding, not bit
    for bit. Products are tensor-core dots with the pair's row as row 0 of a 16-row tile.
    """
    pid = tl.program_id(0)
    nb1 = tl.cdiv(N, GATE_N)
    pair = (pid // nb1).to(tl.int64)
    token = pair // TOPK
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    rows = tl.arange(0, 16)
    live = rows[:, None] == 0  # row 0 carries the pair; rows 1-15 pad the tile to 16
    offs_n = (pid % nb1) * GATE_N + tl.arange(0, GATE_N)
    offs_wn = offs_n % N  # wrapped, as in _gate_up_slice; h is zero past N
    expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
    h = _gate_up_slice(
        x_ptr + token * stride_xm, w1_ptr + expert * stride_w1e,
        tl.load(topk_weights_ptr + pair), offs_n, N, K, stride_w1n,
        EVEN_K, IEEE, GATE_N, BLOCK_SIZE_K,
    )  # fmt: skip
    h = tl.where(offs_n < N, h, 0.0).to(x_ptr.dtype.element_ty)  # as the grouped path rounds it
    a2 = tl.where(live, h[None, :], 0.0).to(x_ptr.dtype.element_ty)
    w2_ptrs = w2_ptr + expert * stride_w2e + offs_k[None, :] * stride_w2k + offs_wn[:, None]
    acc_ptrs = acc_ptr + token * K + offs_k
    for ob in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            w = tl.load(w2_ptrs)
        else:
            w = tl.load(w2_ptrs, mask=(offs_k < K - ob * BLOCK_SIZE_K)[None, :], other=0.0)
        if IEEE:
            y = tl.dot(a2, w, input_precision="ieee")
        else:
            y = tl.dot(a2, w)
        part = tl.sum(y, axis=0)
        if EVEN_K:
            tl.atomic_add(acc_ptrs, part, sem="relaxed")
        else:
            tl.atomic_add(acc_ptrs, part, mask=offs_k < K - ob * BLOCK_SIZE_K, sem="relaxed")
        w2_ptrs += BLOCK_SIZE_K * stride_w2k
        acc_ptrs += BLOCK_SIZE_K
    tl.debug_barrier()  # every thread's adds are issued before the count goes up
    if tl.atomic_add(count_ptr + token, 1, sem="acq_rel") == TOPK * nb1 - 1:
        # Last one in for this token: the row is complete. Swap it out and reset the count.
        tl.store(count_ptr + token, 0)
        for ob in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            o = ob * BLOCK_SIZE_K + offs_k
            # .cg reads L2, where the atomics landed; plain stores then zero the row
            row = tl.load(acc_ptr + token * K + o, mask=o < K, other=0.0, cache_modifier=".cg")
            tl.store(acc_ptr + token * K + o, tl.zeros_like(row), mask=o < K)
            tl.store(out_ptr + token * stride_om + o, row.to(out_ptr.dtype.element_ty), mask=o < K)
