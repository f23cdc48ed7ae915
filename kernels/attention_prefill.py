"""Varlen paged attention in Triton: prefill, chunked prefill, decode and mixed batches in one launch.

Request i's q_len = query_start_loc[i+1] - query_start_loc[i] new tokens are the last q_len of
its seq_len tokens, all already in the paged cache; new token j sits at position
seq_len - q_len + j and attends causally to positions 0..that one, or with a sliding window W
to the keys k with q - W < k <= q (transformers' sliding_window_overlay).

Grid (num_tokens // BLOCK_Q + num_seqs, num_kv_heads): fixed by the shapes alone, so one launch
serves any mix of query lengths and a CUDA graph captured for a token count replays for every
batch of that many tokens (docs/kernels.md). Request i owns the programs from
f(i) = query_start_loc[i] // BLOCK_Q + i on (f(i+1) - f(i) >= cdiv(q_len_i, BLOCK_Q), and
f(num_seqs) <= num_tokens // BLOCK_Q + num_seqs); a program finds its request by a binary search
of f and returns at once past its request's last query block. A
program takes BLOCK_Q query tokens times all GROUP query heads of one KV head, packed as the
BLOCK_M = BLOCK_Q * GROUP_PAD rows of one tl.dot tile (row r = token r // GROUP_PAD, head
r % GROUP_PAD), so each K/V tile is read once per group and a decode row still fills a tile.
It walks the context in BLOCK_N tiles from the first position its first token can see (0, or
that token's window start: earlier blocks are never read) to the last its last token can see.
FP8 caches (float8_e4m3fn): as in attention_decode.py, e4m3 tiles converted to fp16 (16-bit q,
`fp16_query`) or to q's dtype (fp32 q), k_scale folded into the score scale, v_scale into the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_kv_scales, check_paged_kv, check_tensor

LOG2E = 1.4426950408889634


def check_window(sliding_window: int | None) -> int:
    """The window as the kernels take it: a host int, 0 = full attention."""
    if sliding_window is None:
        return 0
    if not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValueError(f"sliding_window must be None or a host int >= 0, got {sliding_window!r}")
    return sliding_window


@triton.jit
def fp16_query(q):
    """A 16-bit q tile [M, D] -> (fp16 tile q * 2^-e, 2^e [M, 1]): per row the least e >= 0 that
    keeps |q| * 2^-e < 2^16, so nothing overflows fp16 (and, below that, every bf16 value in fp16's
    normal range converts exactly). The products of an FP8 cache then run in fp16 (e4m3 -> fp16 is
    one native conversion on sm_90, e4m3 -> bf16 is emulated); 2^e goes into the score scale."""
    qf = q.to(tl.float32)
    biased = tl.max(tl.abs(qf), 1).to(tl.int32, bitcast=True) >> 23  # the row amax's exponent + 127
    e = tl.maximum(biased - 142, 0)  # 142 = 127 + 15: amax < 2^(biased - 126) <= 2^16 after the shift
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e, exact
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2^e
    return (qf * down[:, None]).to(tl.float16), up[:, None]


# num_seqs changes every step: not specialized (==1, %16), so no variant compiles while serving
@triton.jit(do_not_specialize=["num_seqs"])
def _paged_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr,  # FP8 caches: [1] float32 each, read here (unused otherwise)
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_bt,
    stride_ot, stride_oh,
    window,  # sliding window (used when SLIDING): row q sees keys q - window < k <= q
    num_seqs,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr,
    FP8: tl.constexpr, F16_DOT: tl.constexpr,  # F16_DOT: FP8 cache, 16-bit q: products in fp16
    ALIGNED: tl.constexpr,  # batch-invariant: key tiles start at multiples of BLOCK_N, window or not
    SEARCH_STEPS: tl.constexpr,  # >= num_seqs.bit_length(): enough halvings of [0, num_seqs)
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    # seq = the last i with f(i) = query_start_loc[i] // BLOCK_Q + i <= pid (f(0) = 0, f rises)
    lo = tl.full([], 0, tl.int32)  # loop-carried int32 tensors, never constexprs
    hi = tl.full([], 0, tl.int32) + num_seqs
    for _ in range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        f_mid = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(f_mid <= pid, mid, lo)
        hi = tl.where(f_mid <= pid, hi, mid)
    seq = lo
    q_start = tl.load(query_start_loc_ptr + seq)
    q_block = pid - (q_start // BLOCK_Q + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    tok = q_block * BLOCK_Q + offs_m // GROUP_PAD  # token index within the request
    g = offs_m % GROUP_PAD
    heads = kv_head * GROUP + g
    row_mask = (tok < q_len) & (g < GROUP)
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    # Causal limit of each row; rows past q_len see everything (finite, never stored).
    q_pos = tl.where(tok < q_len, seq_len - q_len + tok, seq_len)

    # The last token of this block sees positions < kv_end.
    last_tok = tl.minimum((q_block + 1) * BLOCK_Q, q_len) - 1
    kv_end = tl.minimum(seq_len - q_len + last_tok + 1, seq_len)
    # The first token of this block sees positions >= kv_start; nothing before is loaded.
    kv_start = 0
    kv_first = 0  # ALIGNED: keys before it are not loaded (zeros), as none of them is visible
    if SLIDING:
        kv_start = tl.maximum(seq_len - q_len + q_block * BLOCK_Q - window + 1, 0)
        if ALIGNED:  # the same tiles for a token whichever tokens share its block (hidden keys add 0)
            kv_first = kv_start
            kv_start = kv_start // BLOCK_N * BLOCK_N

    if FP8:  # the K scale, folded into the score scale
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    qk = qk_scale
    if F16_DOT:  # q in fp16, each row's power-of-two shift folded into its score scale
        q, q_mult = fp16_query(q)
        qk = qk_scale * q_mult
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    kv_head_off = kv_head * stride_kh
    for n0 in range(kv_start, kv_end, BLOCK_N):
        pos = n0 + offs_n
        n_mask = pos < kv_end
        if ALIGNED:
            n_mask = n_mask & (pos >= kv_first)
        block_ids = tl.load(bt_row + pos // BLOCK_SIZE, mask=n_mask, other=0)
        row_off = block_ids.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kv_head_off
        kv_off = row_off[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
        k = tl.load(k_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        if FP8:  # e4m3 -> fp16 / q's dtype is exact; the scales are applied in fp32 (qk, acc)
            k = k.to(q.dtype)
            v = v.to(q.dtype)

        s = tl.dot(q, tl.trans(k)) * qk  # [BLOCK_M, BLOCK_N]
        visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        if SLIDING:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row may see nothing yet (window): keep its max at -inf without exp2(-inf + inf) = NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if FP8:  # the V scale, folded into the output
        acc = acc * tl.load(v_scale_ptr)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # seq_len 0 -> zeros
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


def paged_attention_triton(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; allocated (zeros) if None
    sliding_window: int | None = None,  # host int; None / 0 = full attention
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
    batch_invariant: bool = False,  # one tile shape for every step, key tiles at fixed positions
) -> torch.Tensor:
    num_heads, num_kv_heads, head_dim, block_size = check_paged_kv(q, k_cache, v_cache, block_tables, seq_lens)
    fp8 = check_kv_scales(k_cache, k_scale, v_scale)
    window = check_window(sliding_window)
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, "
                         f"got {query_start_loc.shape[0]}")
    if not isinstance(max_query_len, int) or max_query_len < 0:
        raise ValueError(f"max_query_len must be a host int >= 0, got {max_query_len!r}")
    if out is None:
        # Tokens past query_start_loc[-1] belong to no request: zeros, as in the reference.
        out = torch.zeros_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must match q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if num_seqs == 0 or max_query_len == 0 or q.shape[0] == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m = max(64, group_pad) if max_query_len > 1 or batch_invariant else max(16, group_pad)
    block_q = block_m // group_pad
    grid = (q.shape[0] // block_q + num_seqs, num_kv_heads)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        k_scale if fp8 else seq_lens, v_scale if fp8 else seq_lens,  # dummies unless FP8
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        window, num_seqs,
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_N=64, SLIDING=window > 0, FP8=fp8,
        F16_DOT=fp8 and q.dtype != torch.float32, ALIGNED=batch_invariant,
        # at least 9 halvings (up to 511 sequences): one compiled variant for every batch a
        # server runs, not one per bit length compiled while it serves
        SEARCH_STEPS=max(num_seqs.bit_length(), 9),
        num_warps=4 if head_dim <= 64 else 8, num_stages=2,  # no register spills on sm_90
    )
    return out
