"""Token-to-expert alignment (vLLM's moe_align_block_size semantics) as Triton kernels.

Given topk_ids (M, topk), every (token, k) pair gets the flat index t*topk + k. The pairs are
grouped by expert; each expert's group is padded with the sentinel M*topk up to a multiple of
BLOCK_SIZE_M, so every GEMM block of BLOCK_SIZE_M rows belongs to one expert. Outputs:

- sorted_token_ids (int32, max_padded): flat pair indices grouped by expert, sentinel padding
- expert_ids (int32, max_padded // BLOCK_SIZE_M): the expert of each block (-1 past the end)
- num_tokens_post_padded (int32, 1): the padded total actually used

Within one expert the pairs keep their flat order (deterministic). Three launches: a per-chunk
histogram, a single-program prefix sum (which also writes pads and expert ids), and a scatter;
up to 128 pairs (M <= 16 at top-8) one program does it all in a single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cellbench.tune.kernels.placeholders import empty, launch

# Pairs handled by one program of the histogram and scatter kernels.
_CHUNK = 128
# Rows of the per-chunk histogram read at once by the prefix-sum program.
_ROWS = 16
# Blocks whose expert id is resolved at once.
_BLOCKS = 32


def max_padded_tokens(numel: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the padded pair count (sizes the buffers and the GEMM grid)."""
    bound = numel + num_experts * (block_m - 1)
    if numel < num_experts:
        # At most `numel` experts are used, each padded to at most block_m per pair.
        bound = min(bound, numel * block_m)
    return bound


@triton.jit
def _pads_and_experts(
    sorted_ptr,
    expert_ids_ptr,
    pad_start,
    ends,
    total,
    e_ok,
    numel,
    num_blocks,
    BLOCK_M: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """Sentinels in each expert's padding slots [pad_start, end), and each block's expert."""
    cols = tl.arange(0, 16)
    for c0 in range(0, BLOCK_M, 16):
        idx = pad_start[:, None] + c0 + cols[None, :]
        tl.store(sorted_ptr + idx, numel, mask=e_ok[:, None] & (idx < ends[:, None]))
    # A block's expert is the number of experts that end at or before the block's first row.
    blk = tl.arange(0, BLOCKS)
    for b0 in range(0, num_blocks, BLOCKS):
        b = b0 + blk
        first_row = b * BLOCK_M
        before = (ends[None, :] <= first_row[:, None]) & e_ok[None, :]
        eid = tl.sum(before.to(tl.int32), axis=1)
        eid = tl.where(first_row < total, eid, -1)
        tl.store(expert_ids_ptr + b, eid, mask=b < num_blocks)


@triton.jit
def _align_small_kernel(
    ids_ptr,
    sorted_ptr,
    expert_ids_ptr,
    total_ptr,
    numel,
    E,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_P: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """The whole alignment in one program, for at most CHUNK pairs (one launch, not three)."""
    local = tl.arange(0, CHUNK)
    valid = local < numel
    ids = tl.load(ids_ptr + local, mask=valid, other=-1).to(tl.int32)
    experts = tl.arange(0, E_P)
    e_ok = experts < E
    onehot = (ids[:, None] == experts[None, :]).to(tl.int32)
    counts = tl.sum(onehot, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(total_ptr, total)
    same = (ids[:, None] == ids[None, :]) & (local[None, :] < local[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    base = tl.sum(onehot * starts[None, :], axis=1)
    tl.store(sorted_ptr + base + rank, local, mask=valid)
    _pads_and_experts(
        sorted_ptr, expert_ids_ptr, starts + counts, ends, total, e_ok, numel, num_blocks,
        BLOCK_M, BLOCKS,
    )  # fmt: skip


@triton.jit
def _hist_kernel(ids_ptr, hist_ptr, numel, E, CHUNK: tl.constexpr, E_P: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < numel, other=-1).to(tl.int32)
    experts = tl.arange(0, E_P)
    hit = (ids[:, None] == experts[None, :]).to(tl.int32)
    tl.store(hist_ptr + pid * E + experts, tl.sum(hit, axis=0), mask=experts < E)


@triton.jit
def _prefix_kernel(
    hist_ptr,
    offsets_ptr,
    sorted_ptr,
    expert_ids_ptr,
    total_ptr,
    num_chunks,
    numel,
    E,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_P: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    experts = tl.arange(0, E_P)
    e_ok = experts < E
    rows = tl.arange(0, ROWS)
    # Pass 1: pairs per expert.
    counts = tl.zeros((E_P,), dtype=tl.int32)
    for r0 in range(0, num_chunks, ROWS):
        m = ((r0 + rows) < num_chunks)[:, None] & e_ok[None, :]
        tile = tl.load(hist_ptr + (r0 + rows)[:, None] * E + experts[None, :], mask=m, other=0)
        counts += tl.sum(tile, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(total_ptr, total)
    # Pass 2: where each chunk's pairs of each expert start.
    run = starts
    for r0 in range(0, num_chunks, ROWS):
        m = ((r0 + rows) < num_chunks)[:, None] & e_ok[None, :]
        tile = tl.load(hist_ptr + (r0 + rows)[:, None] * E + experts[None, :], mask=m, other=0)
        excl = tl.cumsum(tile, axis=0) - tile + run[None, :]
        tl.store(offsets_ptr + (r0 + rows)[:, None] * E + experts[None, :], excl, mask=m)
        run += tl.sum(tile, axis=0)
    _pads_and_experts(
        sorted_ptr, expert_ids_ptr, starts + counts, ends, total, e_ok, numel, num_blocks,
        BLOCK_M, BLOCKS,
    )  # fmt: skip


@triton.jit
def _scatter_kernel(ids_ptr, offsets_ptr, sorted_ptr, numel, E, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    local = tl.arange(0, CHUNK)
    offs = pid * CHUNK + local
    valid = offs < numel
    ids = tl.load(ids_ptr + offs, mask=valid, other=-1).to(tl.int32)
    # Rank of each pair among the earlier pairs of this chunk with the same expert.
    same = (ids[:, None] == ids[None, :]) & (local[None, :] < local[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    base = tl.load(offsets_ptr + pid * E + ids, mask=valid, other=0)
    tl.store(sorted_ptr + base + rank, offs, mask=valid)


def moe_align_block_size(
    topk_ids: torch.Tensor, block_m: int, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group (token, k) pairs by expert, padded per expert to `block_m`.

    Returns (sorted_token_ids, expert_ids, num_tokens_post_padded), all int32 on the
    device of `topk_ids`; see the module docstring. Expert ids must lie in [0, num_experts).
    """
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D (M, topk), got shape {tuple(topk_ids.shape)}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"BLOCK_SIZE_M={block_m} must be a power of two")
    ids = topk_ids.contiguous()
    numel = ids.numel()
    max_padded = max_padded_tokens(numel, num_experts, block_m)
    num_blocks = triton.cdiv(max_padded, block_m)
    num_chunks = max(1, triton.cdiv(numel, _CHUNK))
    e_p = triton.next_power_of_2(num_experts)

    sorted_ids = empty(ids, (max_padded,), torch.int32)
    expert_ids = empty(ids, (num_blocks,), torch.int32)
    total = empty(ids, (1,), torch.int32)

    if numel <= _CHUNK:
        launch(
            _align_small_kernel, (1,),
            ids, sorted_ids, expert_ids, total, numel, num_experts, num_blocks,
            BLOCK_M=block_m, E_P=e_p, CHUNK=_CHUNK, BLOCKS=_BLOCKS,
        )  # fmt: skip
        return sorted_ids, expert_ids, total
    hist = empty(ids, (num_chunks, num_experts), torch.int32)
    offsets = empty(ids, (num_chunks, num_experts), torch.int32)
    launch(_hist_kernel, (num_chunks,), ids, hist, numel, num_experts, CHUNK=_CHUNK, E_P=e_p)
    launch(
        _prefix_kernel,
        (1,),
        hist,
        offsets,
        sorted_ids,
        expert_ids,
        total,
        num_chunks,
        numel,
        num_experts,
        num_blocks,
        BLOCK_M=block_m,
        E_P=e_p,
        ROWS=_ROWS,
        BLOCKS=_BLOCKS,
    )
    launch(_scatter_kernel, (num_chunks,), ids, offsets, sorted_ids, numel, num_experts,
           CHUNK=_CHUNK)  # fmt: skip
    return sorted_ids, expert_ids, total
