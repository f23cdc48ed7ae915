"""The persistent decode step's work items beside the existing kernels' (kernels/persistent_decode.py):
a layer-table address, a GEMV item, and the attention's merge by the last split done."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention_decode import _decode_merge
from kernels.skinny_acc import _skinny_acc


@triton.jit
def _address(row, column, dt: tl.constexpr):
    """Layer table entry `column` as a pointer to dt, 16-byte aligned (layer_table checks it): the
    compiler then vectorizes its loads (an address loaded from memory has no known alignment, and
    weight loads would be 2 bytes a thread)."""
    return tl.multiple_of(tl.load(row + column).to(tl.pointer_type(dt)), 16)


@triton.jit
def _merge_if_last(att_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, count_ptr, num_splits, seq, kv_head, stride_os,
                   NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """Counts this split of (seq, kv_head) done; the last of its splits merges the group's heads and
    sets the count back to zero (for the next layer, past a grid barrier)."""
    tl.debug_barrier()  # every thread's partials are stored before the one thread's release
    if tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
        tl.debug_barrier()  # the acquire (one thread) before any thread reads the other splits' partials
        for g in range(GROUP):
            _decode_merge(att_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_os, HEAD_DIM, NUM_HEADS, num_splits,
                          seq, kv_head * GROUP + g, HEAD_DIM, SPLITS_PAD)
        tl.store(count_ptr, 0)


@triton.jit
def _gemv_item(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, y_ptr, item, M, N, stride_x, stride_y, eps, wait_ptr, wait_count,
               K: tl.constexpr, TILES: tl.constexpr, PROLOGUE: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr, DOT: tl.constexpr,
               WAIT: tl.constexpr, PREFETCH: tl.constexpr, REDUCE_EACH: tl.constexpr):
    """y[:, item's BLOCK_N columns] = prologue(x) @ w^T (skinny_gemm's program, no split)."""
    offs_n = item * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = _skinny_acc(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, offs_n, n_mask, 0, item == 0,
                      M, stride_x, K, K, K, eps, K, TILES, PROLOGUE, PROLOGUE == 1,
                      BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, False, DOT, wait_ptr, wait_count, WAIT, PREFETCH,
                      REDUCE_EACH)
    rows = tl.arange(0, BLOCK_M)
    tl.store(y_ptr + rows[:, None] * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & n_mask[None, :])
