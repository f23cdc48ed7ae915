"""write_kv in Triton: scatter each token's key and value into its paged-cache slot.

Grid (num_tokens,): one program copies one token's [num_kv_heads, head_dim] key and value.
A negative slot (a token whose KV must not be stored) makes the program return at once.
FP8 caches (float8_e4m3fn) store clamp(x / scale, -448, 448) in e4m3 (IEEE division, round to
nearest even: bit-equal to the reference); the scales are read from device tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import (
    FLOAT_DTYPES,
    FP8_KV_DTYPE,
    check_kv_scales,
    check_power_of_two,
    check_same_device,
    check_tensor,
)


@triton.jit
def quantize_fp8(x, scale):
    """clamp(x / scale, -448, 448) in float32 (IEEE division), ready for .to(tl.float8e4nv)."""
    y = tl.math.div_rn(x.to(tl.float32), scale)
    y = tl.maximum(y, -448.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as torch's clamp
    return tl.minimum(y, 448.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, k_scale_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, FP8: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < NUM_KV_HEADS)[:, None]
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(key_ptr + tok * stride_kt + src, mask=mask)
    src = offs_h[:, None] * stride_vh + offs_d[None, :]
    v = tl.load(value_ptr + tok * stride_vt + src, mask=mask)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
    dst = dst + offs_h[:, None] * stride_ch + offs_d[None, :]
    if FP8:
        k = quantize_fp8(k, tl.load(k_scale_ptr))
        v = quantize_fp8(v, tl.load(v_scale_ptr))
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int32 or int64; < 0 skipped
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
) -> None:
    check_tensor("key", key, 3)
    check_tensor("value", value, 3)
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES + (FP8_KV_DTYPE,))
    check_tensor("v_cache", v_cache, 4, (k_cache.dtype,))
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int32, torch.int64))
    check_same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides")
    num_tokens, num_kv_heads, head_dim = key.shape
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"cache heads/dim {tuple(k_cache.shape[2:])} != key's {(num_kv_heads, head_dim)}")
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    check_power_of_two("head_dim", head_dim)
    fp8 = check_kv_scales(k_cache, k_scale, v_scale)
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        k_scale if fp8 else slot_mapping, v_scale if fp8 else slot_mapping,  # dummies unless FP8
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1], FP8=fp8,
        num_warps=1 if num_kv_heads * head_dim <= 1024 else 4,
    )
