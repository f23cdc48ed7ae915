"""An FP8 weight as the skinny decode kernels take it (kernels/skinny_gemm.py, skinny_rope.py):
e4m3 [N, K] with a float32 multiplier per tensor ([1]) or per output channel ([N]). The kernels
read the fp8 tile (half the bytes of bf16), take its products in fp32 (e4m3 is exact in any wider
float) and scale each output column once, in the epilogue (`_w_scaled`). Block-scaled weights
take kernels/fp8_gemm.py's kernels instead."""

from __future__ import annotations

from typing import NamedTuple

import torch

FP8 = torch.float8_e4m3fn
W_SCALE_NONE, W_SCALE_TENSOR, W_SCALE_CHANNEL = 0, 1, 2


class Fp8Weight(NamedTuple):
    q: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [1] or [N] float32


def unpack_weight(w: torch.Tensor | Fp8Weight) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(the [N, K] tensor a kernel reads, its scale or None, W_SCALE_*)."""
    if isinstance(w, Fp8Weight):
        return w.q, w.scale, W_SCALE_TENSOR if w.scale.numel() == 1 else W_SCALE_CHANNEL
    return w, None, W_SCALE_NONE


def float_weight(w: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """The weight in float32: an Fp8Weight dequantized (fp8 -> fp32, times its scales)."""
    if isinstance(w, Fp8Weight):
        return w.q.float() * w.scale.float().reshape(-1, 1)
    return w.float()
