"""Fused residual add + RMSNorm in Triton: one program per token row, the whole row in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor


@triton.jit
def rms_norm_row(x_ptr, residual_ptr, weight_ptr, new_residual_ptr, row, stride_x, stride_r, stride_nr,
                 eps, hidden, offs, mask, HAS_RESIDUAL: tl.constexpr):
    """One row of (residual add +) RMSNorm, in fp32 before its final rounding; with a residual,
    the sum is rounded to the input dtype (as an unfused model stores it) and stored as the
    next residual. Shared with kernels/fp8_fused.py."""
    h = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_nr + offs, h, mask=mask)
    hf = h.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(hf * hf, 0) / hidden + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return hf * inv_rms * w


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    stride_x, stride_r, stride_o, stride_nr,
    eps, hidden,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    y = rms_norm_row(x_ptr, residual_ptr, weight_ptr, new_residual_ptr, row, stride_x, stride_r, stride_nr,
                     eps, hidden, offs, mask, HAS_RESIDUAL)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def check_norm_inputs(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> int:
    """The RMSNorm kernels' argument checks (this one and kernels/fp8_fused.py); -> hidden."""
    check_tensor("x", x, 2)
    check_tensor("weight", weight, 1)
    hidden = x.shape[1]
    if weight.shape[0] != hidden:
        raise ValueError(f"weight has {weight.shape[0]} entries, hidden is {hidden}")
    if residual is not None:
        check_tensor("residual", residual, 2)
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        check_same_device(x=x, weight=weight, residual=residual)
    return hidden


def rms_norm_triton(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    hidden = check_norm_inputs(x, weight, residual)
    out = torch.empty_like(x)
    new_residual = torch.empty_like(x) if residual is not None else out
    if x.shape[0] > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(x.shape[0],)](
            x, residual if residual is not None else x, weight, out, new_residual,
            x.stride(0), (residual if residual is not None else x).stride(0), out.stride(0),
            new_residual.stride(0), eps, hidden,
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    return out if residual is None else (out, new_residual)
