"""Plain-torch references of the FP8 GEMMs (kernels/fp8_gemm.py): the specification, CPU-runnable.

Weights: float8_e4m3fn [N, K] with float32 multipliers (weight ~ fp8 * scale):
  "tensor" [1]; "channel" [N]; "block" [ceil(N/bn), ceil(K/bk)] for block = (bn, bk).
- w8a16 (weight-only): y = x @ dequantize(w)^T (+ bias), float32 products, rounded once to x's dtype.
- w8a8: the activations are quantized first, dynamically: per token (one scale per row) for
  "tensor"/"channel" weights, per token and group of bk columns for "block" weights;
  scale = max(amax / 448, FP8_MIN_SCALE), q = e4m3(clamp(x / scale, +-448)) (IEEE division,
  round to nearest even); then y = dequantize(q) @ dequantize(w)^T (+ bias) in float32.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_SCALE = 1e-12  # activation scales never go below this (an all-zero row quantizes to zeros)


def dequantize_fp8_reference(weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                             block: tuple[int, int] | None) -> torch.Tensor:
    """fp8 weight [N, K] -> float32 [N, K] times its per-tensor / per-channel / per-block scales."""
    w = weight.float()
    if strategy == "tensor":
        return w * scale.float().reshape(())
    if strategy == "channel":
        return w * scale.float().reshape(-1)[:, None]
    if strategy != "block":
        raise ValueError(f"unknown FP8 weight strategy {strategy!r}")
    n, k = w.shape
    bn, bk = block
    tiles = scale.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]
    return w * tiles


def quantize_activations_reference(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, ceil(K / group_size)]): each row's
    run of group_size columns (the last one may be partial) scaled so its amax lands on 448."""
    m, k = x.shape
    groups = -(-k // group_size)
    xf = x.float()
    padded = torch.zeros(m, groups * group_size, dtype=torch.float32, device=x.device)
    padded[:, :k] = xf
    amax = padded.view(m, groups, group_size).abs().amax(dim=2)
    scale = (amax / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    q = (xf / scale.repeat_interleave(group_size, dim=1)[:, :k]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def activation_group_size(strategy: str, block: tuple[int, int] | None, k: int) -> int:
    """Columns per activation scale: bk for block weights, the whole row otherwise."""
    return block[1] if strategy == "block" else k


def w8a16_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                           block: tuple[int, int] | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(weight)^T (+ bias) in float32, rounded once to x's dtype."""
    y = x.float() @ dequantize_fp8_reference(weight, scale, strategy, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                          block: tuple[int, int] | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dynamic activation quantization (per token, or per token and bk group), then the float32
    product of the two dequantized operands (+ bias), rounded once to x's dtype."""
    k = x.shape[1]
    group = activation_group_size(strategy, block, k)
    q, x_scale = quantize_activations_reference(x, group)
    xq = q.float() * x_scale.repeat_interleave(group, dim=1)[:, :k]
    y = xq @ dequantize_fp8_reference(weight, scale, strategy, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
