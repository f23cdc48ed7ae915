"""silu_and_mul (SwiGLU gate) in Triton: grid (num_tokens, cdiv(inter, BLOCK))."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_tensor


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:  # [num_tokens, 2 * inter] -> [num_tokens, inter]
    check_tensor("x", x, 2)
    if x.shape[1] % 2:
        raise ValueError(f"x's last dim must be even (gate | up), got {x.shape[1]}")
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, device=x.device, dtype=x.dtype)
    if x.shape[0] > 0 and inter > 0:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4,
        )
    return out
