"""Building blocks of the model and the one place that picks the compute kernels.

Kernels come from `kernels` (Triton on CUDA, torch reference otherwise) when it exports them,
else straight from `kernels.reference`. Contract: docs/contracts.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import kernels as _kernels
from kernels import reference as _ref


def _pick(name: str, fallback):
    return getattr(_kernels, name, None) or fallback


def _paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                         max_query_len: int, max_seq_len: int):
    return _ref.paged_attention_reference(q, k_cache, v_cache, block_tables, seq_lens,
                                          query_start_loc, scale)


def paged_decode_attention_torch(
    q: torch.Tensor,  # [B, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, 0 = padded row
    scale: float,
) -> torch.Tensor:  # [B, num_heads, head_dim]
    """Decode attention in static-shape torch ops (no host sync, CUDA-graph capturable).

    Gathers every block of the table, so it reads max_blocks blocks per row: a fallback for
    when no decode kernel exists, not a fast path.
    """
    b, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    k = k_cache[block_tables.long()].flatten(1, 2).float()  # [B, L, kv_heads, D]
    v = v_cache[block_tables.long()].flatten(1, 2).float()
    qg = q.float().view(b, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale  # [B, kv_heads, group, L]
    pos = torch.arange(k.shape[1], device=q.device)
    valid = pos[None, :] < seq_lens[:, None]  # [B, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # padded rows: all -inf -> 0
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(b, num_heads, head_dim).to(q.dtype)


def paged_decode_attention_fallback(q, k_cache, v_cache, block_tables, seq_lens, scale):
    if q.is_cuda:  # the loop reference syncs; this one can be captured
        return paged_decode_attention_torch(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return _ref.paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale)


def write_kv_fallback(key, value, k_cache, v_cache, slot_mapping) -> None:
    """write_kv without the reference's boolean indexing (a host sync) on CUDA: negative
    slots (padded rows) write into slot 0 of the null block, which no request reads."""
    if not key.is_cuda:
        return _ref.write_kv_reference(key, value, k_cache, v_cache, slot_mapping)
    slots = slot_mapping.long().clamp_min(0)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))


# The kernels the model calls (see docs/contracts.md for their signatures).
write_kv = _pick("write_kv", write_kv_fallback)
paged_attention = _pick("paged_attention", _paged_attention_ref)
paged_decode_attention = _pick("paged_decode_attention", paged_decode_attention_fallback)
rms_norm = _pick("rms_norm", _ref.rms_norm_reference)
silu_and_mul = _pick("silu_and_mul", _ref.silu_and_mul_reference)
rotary_embedding = _pick("rotary_embedding", _ref.rotary_embedding_reference)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; forward(x, residual) fuses the residual add (returns both)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32, as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise NotImplementedError(f"rope type {rope_type!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin_cache(head_dim: int, max_positions: int, theta: float,
                       scaling: dict | None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    freqs = torch.arange(max_positions, dtype=torch.float32, device="cpu")[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
