"""Paged decode attention (one query token per request), split-K "flash decoding" in Triton.

Grid (num_seqs, num_kv_heads, num_splits). A program takes ALL query heads of one KV head group
(GQA: each K/V tile is read once per group, the group padded to 16 rows for tl.dot) and one
slice of the context: the seq_len tokens, loaded in-kernel, are cut into num_splits runs of
whole BLOCK_N tiles, so only the valid part of the cache is read. With a sliding window W the
context is the last W positions only; blocks before them are never read. With one split the program
normalises and writes the output; otherwise it writes (acc, max, sum) partials that
_decode_reduce_kernel merges. num_splits and the scratch sizes depend only on shapes, so a call
is CUDA-graph capturable (no host sync, no data-dependent allocation). An FP8 cache (float8_e4m3fn)
is loaded as e4m3 and converted (exactly) to fp16 for tl.dot beside a 16-bit q, which
attention_prefill.fp16_query brings to fp16 (a per-row power-of-two shift, folded into the score
scale, keeps it from overflowing): sm_90 converts e4m3x2 -> f16x2 natively, bf16 is emulated.
With an fp32 q the tiles go to fp32. k_scale is folded into the score scale and v_scale into the
output (both read from device tensors in the kernel). FP8 caches have their own launch
configurations (`decode_launch_config(..., fp8=True)`: twice the tokens per tile, as many bytes).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._checks import check_kv_scales, check_paged_kv, check_power_of_two
from kernels.attention_prefill import check_window, fp16_query

LOG2E = 1.4426950408889634
MAX_SPLITS = 64


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    k_scale_ptr, v_scale_ptr,  # FP8 caches: [1] float32 each, read here (unused otherwise)
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_os, stride_oh, num_splits,
    window,  # sliding window (used when SLIDING): keys seq_len - window <= k < seq_len
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, SLIDING: tl.constexpr,
    FP8: tl.constexpr, F16_DOT: tl.constexpr,  # F16_DOT: FP8 cache, 16-bit q: products in fp16
    USE_PDL: tl.constexpr = False,  # a programmatic dependent launch (kernels/skinny_gemm.py)
):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _decode_split(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                  out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, k_scale_ptr, v_scale_ptr, qk_scale,
                  stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_os, stride_oh,
                  num_splits, window, tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1),
                  GROUP, GROUP_PAD, HEAD_DIM, BLOCK_SIZE, BLOCK_N, DIRECT, SLIDING, FP8, F16_DOT)


@triton.jit
def _decode_split(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, k_scale_ptr, v_scale_ptr, qk_scale,
    stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_os, stride_oh,
    num_splits, window, seq, kv_head, split, num_kv_heads,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, SLIDING: tl.constexpr,
    FP8: tl.constexpr, F16_DOT: tl.constexpr,
):
    """One program's work (the kernel's, and kernels/persistent_decode.py's work items): the
    query heads of (seq, kv_head) over the split-th run of their context."""
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None], other=0.0)  # [GROUP_PAD, HEAD_DIM]

    # The query (position seq_len - 1) sees [lo, seq_len); this split's run of whole tiles of it
    # is [start, end).
    lo = 0
    if SLIDING:
        lo = tl.maximum(seq_len - window, 0)
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len - lo, BLOCK_N), num_splits)
    start = lo + split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    if FP8:  # the K scale, folded into the score scale
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    qk = qk_scale
    if F16_DOT:  # q in fp16, each row's power-of-two shift folded into its score scale
        q, q_mult = fp16_query(q)
        qk = qk_scale * q_mult
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    kv_head_off = kv_head * stride_kh
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        n_mask = pos < end
        block_ids = tl.load(bt_row + pos // BLOCK_SIZE, mask=n_mask, other=0)
        row_off = block_ids.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kv_head_off
        kv_off = row_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
        k = tl.load(k_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        if FP8:  # e4m3 -> fp16 / q's dtype is exact; the scales are applied in fp32 (qk, acc)
            k = k.to(q.dtype)
            v = v.to(q.dtype)

        s = tl.dot(q, tl.trans(k)) * qk  # [GROUP_PAD, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds a valid position
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if FP8:  # the V scale, folded into the output (or the partial acc: the reduce is linear in it)
        acc = acc * tl.load(v_scale_ptr)
    if DIRECT:  # one split: normalise and write the output here
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # seq_len 0 -> zeros
        o_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])
    else:
        # partials [num_seqs, num_heads, num_splits(, HEAD_DIM)], contiguous; empty splits
        # write m = -inf, l = 0, acc = 0, which the reduce weighs as nothing.
        row = (seq * (num_kv_heads * GROUP) + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None])


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    stride_os, stride_oh, num_heads, num_splits,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    """Merges the split partials of one (seq, head): out = sum(w * acc) / sum(w * l), w = 2^(m - max m)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    _decode_merge(out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_os, stride_oh, num_heads, num_splits,
                  tl.program_id(0), tl.program_id(1), HEAD_DIM, SPLITS_PAD)


@triton.jit
def _decode_merge(out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_os, stride_oh, num_heads, num_splits,
                  seq, head, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """The reduce kernel's work for one (seq, head)."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < num_splits
    row = (seq * num_heads + head) * num_splits + offs_s
    m = tl.load(part_m_ptr + row, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + row, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty (seq_len 0)
    w = tl.exp2(m - m_max)  # 0 for empty splits
    l_sum = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(l_sum == 0.0, 1.0, l_sum)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # interpreter runs: pretend to be an H200
    return torch.cuda.get_device_properties(device).multi_processor_count


class DecodeConfig(NamedTuple):
    block_n: int  # context tokens per tile
    num_splits: int
    num_warps: int
    num_stages: int


def decode_launch_config(num_seqs: int, num_kv_heads: int, max_context: int, num_sms: int,
                         head_dim: int = 64, fp8: bool = False) -> DecodeConfig:
    """The launch from shapes only, never from seq_lens (graph capture).

    Swept on an H200 at llama-1b shapes (benchmarks/attention_sweep.py, head dim 64, random
    block tables, 2026-12-01): from ~6 (seq, kv head) pairs per SM, 64-token tiles, 2 warps,
    no split reach 90-96% of the copy bandwidth (batch 256 context 512: 69.8 us, was 76.6 with
    32-token tiles and 4 warps; 1024: 133 us); from ~3 pairs per SM, 128-token tiles with 4
    warps and 4 stages (batch 64: 20.2 vs 21.9 us); below, 64-token tiles with splits bringing
    the grid to ~4 programs per SM. Head dim 128 keeps the earlier, unswept choice (8 warps).
    FP8 caches (not swept yet: `attention_sweep --kv fp8`): twice the tokens per tile (the
    bytes of a bf16 tile), 4 warps (8 at head dim 128), splits counted in those tiles.
    """
    base = max(num_seqs * num_kv_heads, 1)
    if fp8:
        block_n, warps = (128, 4) if head_dim <= 64 else (64, 8)
        if base >= 3 * num_sms:
            return DecodeConfig(block_n, 1, warps, 4 if base < 6 * num_sms else 3)
        splits = max(1, min((4 * num_sms) // base, MAX_SPLITS, triton.cdiv(max_context, block_n)))
        return DecodeConfig(block_n, splits, warps, 3)
    if head_dim > 64:
        if base >= 6 * num_sms:
            return DecodeConfig(32, 1, 8, 3)
    elif base >= 6 * num_sms:
        return DecodeConfig(64, 1, 2, 3)
    elif base >= 3 * num_sms:
        return DecodeConfig(128, 1, 4, 4)
    splits = max(1, min((4 * num_sms) // base, MAX_SPLITS, triton.cdiv(max_context, 64)))
    return DecodeConfig(64, splits, 4 if head_dim <= 64 else 8, 3)


def decode_variant(num_seqs: int, num_kv_heads: int, max_context: int, head_dim: int, fp8: bool,
                   device: torch.device) -> tuple:
    """What selects the compiled variants of a decode launch of num_seqs rows (the executor's
    warm-up meets each once): the launch config's tile, warps and stages, one split or more
    (DIRECT), and num_splits as Triton specializes the integer (1, a multiple of 16) and the
    reduce kernel pads it (SPLITS_PAD)."""
    cfg = decode_launch_config(num_seqs, num_kv_heads, max_context, _num_sms(device), head_dim, fp8)
    splits = cfg.num_splits
    return (cfg.block_n, cfg.num_warps, cfg.num_stages, splits == 1, splits % 16 == 0,
            triton.next_power_of_2(splits))


def paged_decode_attention_triton(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    num_splits: int | None = None,  # override (tests); default from shapes
    out: torch.Tensor | None = None,  # [num_seqs, num_heads, head_dim]; allocated if None
    block_n: int | None = None,  # override (tuning): context tokens per tile
    sliding_window: int | None = None,  # host int; None / 0 = full attention
    num_warps: int | None = None,  # override (tuning); default from decode_launch_config
    num_stages: int | None = None,  # override (tuning)
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
    pdl: bool = False,  # programmatic dependent launches (compute capability 9.0+)
) -> torch.Tensor:
    num_heads, num_kv_heads, head_dim, block_size = check_paged_kv(q, k_cache, v_cache, block_tables, seq_lens)
    fp8 = check_kv_scales(k_cache, k_scale, v_scale)
    window = check_window(sliding_window)
    num_seqs = q.shape[0]
    if seq_lens.shape[0] != num_seqs:
        raise ValueError(f"decode: q has {num_seqs} rows but seq_lens has {seq_lens.shape[0]}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must match q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    max_context = block_tables.shape[1] * block_size
    if window:
        max_context = min(max_context, window)  # the most keys a query reads
    auto = decode_launch_config(num_seqs, num_kv_heads, max_context, _num_sms(q.device), head_dim, fp8)
    if num_splits is None and block_n is None:
        block_n, num_splits = auto.block_n, auto.num_splits
    block_n = block_n or 32
    num_splits = num_splits or 1
    num_warps = num_warps or auto.num_warps
    num_stages = num_stages or auto.num_stages
    check_power_of_two("block_n", block_n, 16)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if num_splits > 1:
        part_m = torch.empty(num_seqs, num_heads, num_splits, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    else:
        part_m = part_l = part_acc = out  # unused
    launch = {"launch_pdl": True} if pdl else {}  # (the interpreter takes no launch_pdl)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens,
        out, part_acc, part_m, part_l,
        k_scale if fp8 else seq_lens, v_scale if fp8 else seq_lens,  # dummies unless FP8
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        num_splits, window,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, DIRECT=num_splits == 1, SLIDING=window > 0,
        FP8=fp8, F16_DOT=fp8 and q.dtype != torch.float32, USE_PDL=pdl, num_warps=num_warps,
        num_stages=num_stages, **launch,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out, part_acc, part_m, part_l,
            out.stride(0), out.stride(1), num_heads, num_splits,
            HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits), USE_PDL=pdl,
            num_warps=1 if head_dim <= 64 else 2, **launch,
        )
    return out
