"""Rotary position embedding in Triton, in place on q and k: one program per token.

Each program rotates all query heads and all key heads of its token with the token's cos/sin
row (cos_sin_cache[pos] = cos | sin halves). NeoX style pairs element i with i + D/2; GPT-J
style pairs 2i with 2i + 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_power_of_two, check_same_device, check_tensor


@triton.jit
def _rotate_heads(x_ptr, stride_h, num_heads, cos, sin,
                  HEADS_PAD: tl.constexpr, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    offs_h = tl.arange(0, HEADS_PAD)
    offs_i = tl.arange(0, HALF)
    if IS_NEOX:
        i1 = offs_i
        i2 = offs_i + HALF
    else:
        i1 = 2 * offs_i
        i2 = 2 * offs_i + 1
    mask = (offs_h < num_heads)[:, None]
    p1 = x_ptr + offs_h[:, None] * stride_h + i1[None, :]
    p2 = x_ptr + offs_h[:, None] * stride_h + i2[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(p2, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    num_heads, num_kv_heads,
    Q_HEADS_PAD: tl.constexpr, K_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, IS_NEOX: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    offs_i = tl.arange(0, HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_i).to(tl.float32)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_i).to(tl.float32)[None, :]
    _rotate_heads(q_ptr + tok * stride_qt, stride_qh, num_heads, cos, sin, Q_HEADS_PAD, HALF, IS_NEOX)
    _rotate_heads(k_ptr + tok * stride_kt, stride_kh, num_kv_heads, cos, sin, K_HEADS_PAD, HALF, IS_NEOX)


def rotary_embedding_triton(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], modified in place
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], modified in place
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_tensor("q", q, 3)
    check_tensor("k", k, 3)
    check_tensor("cos_sin_cache", cos_sin_cache, 2)
    check_tensor("positions", positions, 1, (torch.int32, torch.int64))
    check_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if positions.shape[0] != num_tokens:
        raise ValueError(f"positions has {positions.shape[0]} entries for {num_tokens} tokens")
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache row is {cos_sin_cache.shape[1]} wide, head_dim is {head_dim}")
    check_power_of_two("head_dim", head_dim, 2)
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            positions, q, k, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            num_heads, k.shape[1],
            Q_HEADS_PAD=triton.next_power_of_2(num_heads), K_HEADS_PAD=triton.next_power_of_2(k.shape[1]),
            HALF=head_dim // 2, IS_NEOX=is_neox, num_warps=4,
        )
    return q, k
