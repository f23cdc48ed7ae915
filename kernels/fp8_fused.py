"""Activation quantization fused into the kernel before an FP8 w8a8 GEMM (kernels/fp8_w8a8.py):
RMSNorm (+ residual add) and SiLU-and-mul that emit e4m3 activations and their float32 scales
(an `Fp8Activation`) instead of 16-bit ones, saving the quantization launch and a round trip of
the activations through memory before qkv_proj, gate_up_proj and down_proj.

One program per row holds the whole row in registers (BLOCK = next_pow2(K) >= GROUP): it computes
the norm / gate exactly as kernels/norm.py / kernels/activation.py do, rounds it to the input
dtype where those store it, then quantizes each GROUP of columns as `_quant_kernel` does (GROUP
= BLOCK: one scale per token; else bk-column groups for block-scaled weights): scale =
max(amax / 448, FP8_MIN_SCALE), q = e4m3(clamp(y / scale, +-448)), IEEE divisions. So the output
is bit-equal to the unfused kernels in sequence on CUDA; the references
(`rms_norm_quant_reference`, `silu_and_mul_quant_reference`) are the unfused references in
sequence. Grid (M,), shape-only allocation, no host sync: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_tensor
from kernels.fp8_reference import FP8, FP8_MIN_SCALE, FUSED_MAX_K, Fp8Activation
from kernels.norm import check_norm_inputs, rms_norm_row


@triton.jit
def _quantize_row(y, offs, mask, q_row_ptr, s_row_ptr, k, min_scale, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """y [BLOCK] float32 (0 where masked) -> e4m3 at q_row_ptr + offs, one scale per GROUP columns."""
    NG: tl.constexpr = BLOCK // GROUP
    y2 = tl.reshape(y, [NG, GROUP])
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(y2), axis=1), 448.0), min_scale)  # [NG]
    q = tl.minimum(tl.maximum(tl.math.div_rn(y2, scale[:, None]), -448.0), 448.0)
    tl.store(q_row_ptr + tl.reshape(offs, [NG, GROUP]), q.to(q_row_ptr.dtype.element_ty),
             mask=tl.reshape(mask, [NG, GROUP]))
    g = tl.arange(0, NG)
    tl.store(s_row_ptr + g, scale, mask=g * GROUP < k)


@triton.jit
def _rms_norm_quant_kernel(
    x_ptr, residual_ptr, weight_ptr, q_ptr, s_ptr, new_residual_ptr,
    stride_x, stride_r, stride_q, stride_s, stride_nr, eps, hidden, min_scale,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    y = rms_norm_row(x_ptr, residual_ptr, weight_ptr, new_residual_ptr, row, stride_x, stride_r, stride_nr,
                     eps, hidden, offs, mask, HAS_RESIDUAL)
    y = y.to(x_ptr.dtype.element_ty).to(tl.float32)  # what rms_norm would store
    _quantize_row(y, offs, mask, q_ptr + row * stride_q, s_ptr + row * stride_s, hidden, min_scale, BLOCK, GROUP)


@triton.jit
def _silu_and_mul_quant_kernel(x_ptr, q_ptr, s_ptr, stride_x, stride_q, stride_s, inter, min_scale,
                               BLOCK: tl.constexpr, GROUP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty).to(tl.float32)  # as silu_and_mul stores it
    _quantize_row(y, offs, mask, q_ptr + row * stride_q, s_ptr + row * stride_s, inter, min_scale, BLOCK, GROUP)


def _launch_shape(k: int, group_size: int | None) -> tuple[int, int, int]:
    """(BLOCK, GROUP, groups): group_size None / k = one scale per row; else a power of two."""
    if k > FUSED_MAX_K:
        raise ValueError(f"fused FP8 quantization holds a row in registers: K <= {FUSED_MAX_K}, got {k}")
    if group_size is None or group_size == k:
        block = triton.next_power_of_2(k)
        return block, block, 1
    if group_size < 1 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be K or a power of two, got {group_size}")
    return max(triton.next_power_of_2(k), group_size), group_size, triton.cdiv(k, group_size)


def _outputs(x: torch.Tensor, k: int, groups: int) -> Fp8Activation:
    return Fp8Activation(torch.empty(x.shape[0], k, device=x.device, dtype=FP8),
                         torch.empty(x.shape[0], groups, device=x.device, dtype=torch.float32), x.dtype)


def rms_norm_quant_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                          group_size: int | None = None):
    """rms_norm_triton emitting FP8: Fp8Activation, or (Fp8Activation, new residual) with residual."""
    hidden = check_norm_inputs(x, weight, residual)
    block, group, groups = _launch_shape(hidden, group_size)
    act = _outputs(x, hidden, groups)
    new_residual = torch.empty_like(x) if residual is not None else x
    if x.shape[0] > 0:
        res = residual if residual is not None else x
        _rms_norm_quant_kernel[(x.shape[0],)](
            x, res, weight, act.q, act.scale, new_residual,
            x.stride(0), res.stride(0), act.q.stride(0), act.scale.stride(0), new_residual.stride(0),
            eps, hidden, FP8_MIN_SCALE, HAS_RESIDUAL=residual is not None, BLOCK=block, GROUP=group,
            num_warps=min(16, max(1, block // 256)),
        )
    return act if residual is None else (act, new_residual)


def silu_and_mul_quant_triton(x: torch.Tensor, group_size: int | None = None) -> Fp8Activation:
    """silu_and_mul_triton emitting FP8: [T, 2I] -> Fp8Activation of [T, I]."""
    check_tensor("x", x, 2)
    if x.shape[1] % 2:
        raise ValueError(f"x's last dim must be even (gate | up), got {x.shape[1]}")
    inter = x.shape[1] // 2
    block, group, groups = _launch_shape(inter, group_size)
    act = _outputs(x, inter, groups)
    if x.shape[0] > 0 and inter > 0:
        _silu_and_mul_quant_kernel[(x.shape[0],)](
            x, act.q, act.scale, x.stride(0), act.q.stride(0), act.scale.stride(0), inter, FP8_MIN_SCALE,
            BLOCK=block, GROUP=group, num_warps=min(16, max(1, block // 512)),
        )
    return act
