"""Plain-torch references of the KV-cache write and of paged attention (the specification),
re-exported by kernels/reference.py.

KV-cache layout (one pair of tensors per layer):
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
A token at position p of a request lives in block block_table[p // block_size], offset
p % block_size; its slot is block_id * block_size + offset. Block 0 is the null block.

FP8 caches (torch.float8_e4m3fn) hold x / scale: a write stores clamp(x / scale, -448, 448)
rounded to e4m3 (nearest even, torch's .to), a read is fp8 * scale in float32, with one float32
scale per layer for K and one for V (`k_scale`, `v_scale`: tensors of shape [1]). A cache in
fp16/bf16/fp32 stores values as they are and ignores the scales.
"""

from __future__ import annotations

import torch

from kernels._checks import FP8_KV_DTYPE, check_kv_scales

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_kv_reference(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """x as a cache of cache_dtype stores it: FP8 clamp(x / scale, -448, 448) in e4m3 (math in
    float32), else x in cache_dtype."""
    if cache_dtype != FP8_KV_DTYPE:
        return x.to(cache_dtype)
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv_reference(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cache values as float32: FP8 fp8 * scale, else the values as they are."""
    if cache.dtype != FP8_KV_DTYPE:
        return cache.float()
    return cache.float() * scale.float()


def write_kv_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int, negative = skip
    k_scale: torch.Tensor | None = None,  # [1] float32, FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
) -> None:
    """Writes each token's key and value into its slot of the paged cache, in place (FP8 caches:
    quantize_kv_reference with the layer's scales)."""
    check_kv_scales(k_cache, k_scale, v_scale)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = quantize_kv_reference(key[keep], k_cache.dtype, k_scale)
    v_flat[slots] = quantize_kv_reference(value[keep], v_cache.dtype, v_scale)


def gather_kv_reference(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int
    seq_len: int,
    start: int = 0,
) -> torch.Tensor:
    """Cached vectors of positions start..seq_len-1 of one request: [seq_len - start, num_kv_heads,
    head_dim]. Blocks before the one holding `start` are not read."""
    block_size = cache.shape[1]
    first = start // block_size
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[first:num_blocks].long()]  # [n, block_size, kv_heads, dim]
    return blocks.reshape(-1, *cache.shape[2:])[start - first * block_size:seq_len - first * block_size]


def window_start(first_pos: int, sliding_window: int | None) -> int:
    """First key position a query at first_pos (or later) can see: 0, or with a window W the
    keys k with q - W < k <= q, as transformers' sliding_window_overlay masks them."""
    return max(first_pos - sliding_window + 1, 0) if sliding_window else 0


def paged_attention_reference(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], requests' new tokens back to back
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int
    seq_lens: torch.Tensor,  # [num_seqs] int: context length after this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int: offsets of each request's tokens in q
    scale: float,
    sliding_window: int | None = None,  # None / 0: full causal attention
    k_scale: torch.Tensor | None = None,  # [1] float32, FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of new tokens over the paged cache (which already holds them).

    Request i's q_len new tokens are the last q_len positions of its seq_lens[i] tokens:
    new token j sits at position q = seq_len - q_len + j and attends to positions 0..q, or with
    a sliding window W to q - W < k <= q (keys before the first token's window are never
    read). Decode (q_len = 1), prefill and chunked prefill are all this one function.
    Grouped-query attention: query head h reads KV head h // (num_heads // num_kv_heads).
    Returns [num_tokens, num_heads, head_dim] in q's dtype; math in float32, over the cache
    dequantized to float32 (FP8: fp8 * scale).
    """
    check_kv_scales(k_cache, k_scale, v_scale)
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        q_len = end - start
        if q_len == 0 or seq_len == 0:
            continue
        lo = window_start(seq_len - q_len, sliding_window)
        k = dequantize_kv_reference(gather_kv_reference(k_cache, block_tables[i], seq_len, lo), k_scale)
        v = dequantize_kv_reference(gather_kv_reference(v_cache, block_tables[i], seq_len, lo), v_scale)
        k = k.repeat_interleave(group, dim=1)  # [seq_len - lo, num_heads, dim]
        v = v.repeat_interleave(group, dim=1)
        qi = q[start:end].float()  # [q_len, num_heads, dim]
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(lo, seq_len, device=q.device)[None, :]
        hidden = k_pos > q_pos
        if sliding_window:
            hidden |= k_pos <= q_pos - sliding_window
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def paged_decode_attention_reference(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim], one new token per request
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    seq_lens: torch.Tensor,  # [num_seqs]; 0 = padded row, output zeros
    scale: float,
    sliding_window: int | None = None,  # None / 0: full attention
    k_scale: torch.Tensor | None = None,  # [1] float32, FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: paged_attention_reference with one query token per request."""
    query_start_loc = torch.arange(q.shape[0] + 1, device=q.device)
    return paged_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                                     sliding_window, k_scale, v_scale)
