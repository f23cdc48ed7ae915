"""Dispatch of the batch-invariant GEMM (--deterministic, docs/deterministic.md): Triton on CUDA
tensors (imported lazily, as in kernels/__init__.py), the per-row reference otherwise."""

from __future__ import annotations

import torch

from kernels import reference_invariant


def linear_invariant(
    x: torch.Tensor,  # [..., K]
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    out: torch.Tensor | None = None,  # [M, N] (M = x's rows), any float dtype
    pdl: bool = False,  # CUDA: as programmatic dependent launches (Hopper)
) -> torch.Tensor:
    """x @ w^T (+ bias), fp32 accumulation, each row's result independent of the other rows
    (--deterministic; kernels/gemm_invariant.py). CPU: one row at a time."""
    if x.is_cuda:
        from kernels.gemm_invariant import linear_invariant_triton

        return linear_invariant_triton(x, w, bias, out, pdl=pdl)
    y = reference_invariant.linear_invariant_reference(x, w, bias)
    return y if out is None else out.copy_(y.reshape(out.shape))
