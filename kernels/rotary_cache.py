"""Fused per-layer attention prologue in Triton: [q/k RMSNorm] + rotary + KV-cache write, one launch.

Input is the fused qkv projection `[T, (Hq + 2 * Hk) * D]`: per token, Hq query heads, then Hk key
heads, then Hk value heads, each D wide. Grid `(T, 2)`: program (t, 0) takes every query head of
token t as one [Hq, D/2] tile pair, optionally RMS-normalises each head (Qwen3's q_norm), rotates
them and stores them into the new contiguous q `[T, Hq, D]`; program (t, 1) skips everything when
the token's slot is negative, otherwise does the same for the Hk key heads (k_norm) and copies the
value heads, into the paged cache. qkv itself is never modified. (A program a head, 40 one-warp
programs a llama-1b token, took 7.5 µs a launch at 256 tokens: issue 27's profiles.)

Math in float32. The normalised head is rounded to the input dtype before the rotation, exactly
as the unfused sequence (rms_norm, then rotary_embedding) holds it in memory. An FP8 cache
(float8_e4m3fn) gets the rotated key, rounded to the input dtype first (as the reference holds it),
and the value as clamp(x / scale, -448, 448) in e4m3 (kernels/cache.py quantize_fp8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import (
    cache_dtypes,
    check_contiguous,
    check_kv_scales,
    check_power_of_two,
    check_same_device,
    check_tensor,
)
from kernels.cache import quantize_fp8


@triton.jit
def _rms_norm_heads(x1, x2, weight_ptr, i1, i2, eps, HEAD_DIM: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """RMSNorm of each head (a row of [heads, D/2] halves, float32); the result rounded to OUT_DTYPE."""
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)[:, None]
    w1 = tl.load(weight_ptr + i1).to(tl.float32)[None, :]
    w2 = tl.load(weight_ptr + i2).to(tl.float32)[None, :]
    y1 = (x1 * inv_rms * w1).to(OUT_DTYPE).to(tl.float32)
    y2 = (x2 * inv_rms * w2).to(OUT_DTYPE).to(tl.float32)
    return y1, y2


@triton.jit
def _load_heads(row, first, heads, mask, i1, i2, norm_ptr, eps, HAS_NORM: tl.constexpr,
                HEAD_DIM: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Heads first + heads of one qkv row as their two rotary halves [heads, D/2], float32,
    [RMS-normalised and rounded]."""
    src = row + (first + heads)[:, None] * HEAD_DIM
    x1 = tl.load(src + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        x1, x2 = _rms_norm_heads(x1, x2, norm_ptr, i1, i2, eps, HEAD_DIM, OUT_DTYPE)
    return x1, x2


@triton.jit
def _rotary_write_kv_kernel(
    positions_ptr, qkv_ptr, cos_sin_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr,
    q_out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
    stride_qkv, stride_cos_sin, stride_q_out, stride_cb, stride_cs, stride_ch,
    eps,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    Q_PAD: tl.constexpr, KV_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, IS_NEOX: tl.constexpr, HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr,
    FP8: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    if USE_PDL:  # a programmatic dependent launch: wait for the kernel before (kernels/skinny_gemm.py)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    dtype = qkv_ptr.dtype.element_ty
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_i = tl.arange(0, HALF)
    if IS_NEOX:  # pairs (i, i + D/2)
        i1 = offs_i
        i2 = offs_i + HALF
    else:  # GPT-J: pairs (2i, 2i + 1)
        i1 = 2 * offs_i
        i2 = 2 * offs_i + 1

    pos = tl.load(positions_ptr + tok).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + offs_i).to(tl.float32)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + HALF + offs_i).to(tl.float32)[None, :]
    # q heads, k heads, v heads back to back in a qkv row: head h starts at h * HEAD_DIM
    row = qkv_ptr + tok * stride_qkv
    # x1 cos - x2 sin and x2 cos + x1 sin with explicit FMAs: what LLVM's contraction made of the
    # plain expressions (Triton 3.6, sm_90 PTX compared), pinned so that the fused rope epilogue
    # (kernels/skinny_rope.py) rounds as this kernel does whatever the contraction
    if tl.program_id(1) == 0:  # every query head of the token
        heads = tl.arange(0, Q_PAD)
        mask = (heads < NUM_HEADS)[:, None]
        x1, x2 = _load_heads(row, 0, heads, mask, i1, i2, q_norm_ptr, eps, HAS_Q_NORM, HEAD_DIM, dtype)
        dst = q_out_ptr + tok * stride_q_out + heads[:, None] * HEAD_DIM
        tl.store(dst + i1[None, :], tl.fma(x1, cos, -(x2 * sin)).to(dtype), mask=mask)
        tl.store(dst + i2[None, :], tl.fma(x1, sin, x2 * cos).to(dtype), mask=mask)
    else:  # every key and value head, unless the slot is negative
        slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
        if slot >= 0:
            heads = tl.arange(0, KV_PAD)
            mask = (heads < NUM_KV_HEADS)[:, None]
            x1, x2 = _load_heads(row, NUM_HEADS, heads, mask, i1, i2, k_norm_ptr, eps, HAS_K_NORM, HEAD_DIM, dtype)
            k1 = tl.fma(x1, cos, -(x2 * sin)).to(dtype)
            k2 = tl.fma(x1, sin, x2 * cos).to(dtype)
            offs_d = tl.arange(0, HEAD_DIM)[None, :]
            v = tl.load(row + (NUM_HEADS + NUM_KV_HEADS + heads)[:, None] * HEAD_DIM + offs_d, mask=mask)
            if FP8:
                cache_dtype = k_cache_ptr.dtype.element_ty
                k_scale = tl.load(k_scale_ptr)
                k1 = quantize_fp8(k1, k_scale).to(cache_dtype)
                k2 = quantize_fp8(k2, k_scale).to(cache_dtype)
                v = quantize_fp8(v, tl.load(v_scale_ptr)).to(cache_dtype)
            dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads[:, None] * stride_ch
            tl.store(k_cache_ptr + dst + i1[None, :], k1, mask=mask)
            tl.store(k_cache_ptr + dst + i2[None, :], k2, mask=mask)
            tl.store(v_cache_ptr + dst + offs_d, v, mask=mask)


def rotary_write_kv_triton(
    positions: torch.Tensor,  # [T] int32/int64
    qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim], last dim contiguous
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]: cos | sin halves
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], qkv's dtype or FP8
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int32/int64; < 0 skipped
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    is_neox: bool = True,
    q_norm_weight: torch.Tensor | None = None,  # [head_dim]
    k_norm_weight: torch.Tensor | None = None,  # [head_dim]
    eps: float = 1e-6,
    out: torch.Tensor | None = None,  # [T, num_heads, head_dim] contiguous, for q; new if None
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
    pdl: bool = False,  # a programmatic dependent launch (compute capability 9.0+)
) -> torch.Tensor:
    """Returns the rotated q as a contiguous [T, num_heads, head_dim] tensor (`out` if given, else
    new); writes the rotated k and v to the cache."""
    check_tensor("qkv", qkv, 2)
    check_tensor("cos_sin_cache", cos_sin_cache, 2)
    check_tensor("positions", positions, 1, (torch.int32, torch.int64))
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int32, torch.int64))
    check_tensor("k_cache", k_cache, 4, cache_dtypes(qkv.dtype))
    check_tensor("v_cache", v_cache, 4, (k_cache.dtype,))
    fp8 = check_kv_scales(k_cache, k_scale, v_scale)
    check_same_device(positions=positions, qkv=qkv, cos_sin_cache=cos_sin_cache, k_cache=k_cache,
                      v_cache=v_cache, slot_mapping=slot_mapping)
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None:
            check_tensor(name, w, 1)
            check_same_device(qkv=qkv, **{name: w})
            if w.shape[0] != head_dim:
                raise ValueError(f"{name} has {w.shape[0]} entries, head_dim is {head_dim}")
    num_tokens = qkv.shape[0]
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv row is {qkv.shape[1]} wide, expected (num_heads + 2 * num_kv_heads) * head_dim "
                         f"= {(num_heads + 2 * num_kv_heads) * head_dim}")
    if positions.shape[0] != num_tokens or slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"positions ({positions.shape[0]}) and slot_mapping ({slot_mapping.shape[0]}) "
                         f"must have one entry per token ({num_tokens})")
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache row is {cos_sin_cache.shape[1]} wide, head_dim is {head_dim}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides")
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"cache heads/dim {tuple(k_cache.shape[2:])} != {(num_kv_heads, head_dim)}")
    check_power_of_two("head_dim", head_dim, 2)
    if out is None:
        q = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    else:
        q = out
        check_tensor("out", q, 3, (qkv.dtype,))
        check_contiguous("out", q)
        check_same_device(qkv=qkv, out=q)
        if tuple(q.shape) != (num_tokens, num_heads, head_dim):
            raise ValueError(f"out is {tuple(q.shape)}, expected {(num_tokens, num_heads, head_dim)}")
    if num_tokens == 0:
        return q
    q_pad, kv_pad = triton.next_power_of_2(num_heads), triton.next_power_of_2(num_kv_heads)
    _rotary_write_kv_kernel[(num_tokens, 2)](
        positions, qkv, cos_sin_cache, slot_mapping,
        q_norm_weight if q_norm_weight is not None else qkv,  # dummies, never read
        k_norm_weight if k_norm_weight is not None else qkv,
        q, k_cache, v_cache,
        k_scale if fp8 else slot_mapping, v_scale if fp8 else slot_mapping,  # dummies unless FP8
        qkv.stride(0), cos_sin_cache.stride(0), q.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, Q_PAD=q_pad, KV_PAD=kv_pad,
        BLOCK_SIZE=k_cache.shape[1],
        IS_NEOX=is_neox, HAS_Q_NORM=q_norm_weight is not None, HAS_K_NORM=k_norm_weight is not None,
        FP8=fp8, USE_PDL=pdl, num_warps=max(1, min(8, q_pad * head_dim // 512)),
        **({"launch_pdl": True} if pdl else {}),
    )
    return q
