"""Plain-torch references of the FP8 GEMMs (kernels/fp8_gemm.py): the specification, CPU-runnable.

Weights: float8_e4m3fn [N, K] with float32 multipliers (weight ~ fp8 * scale):
  "tensor" [1]; "channel" [N]; "block" [ceil(N/bn), ceil(K/bk)] for block = (bn, bk).
- w8a16 (weight-only): y = x @ dequantize(w)^T (+ bias), float32 products, rounded once to x's dtype.
- w8a8: the activations are quantized first, dynamically: per token (one scale per row) for
  "tensor"/"channel" weights, per token and group of bk columns for "block" weights;
  scale = max(amax / 448, FP8_MIN_SCALE), q = e4m3(clamp(x / scale, +-448)) (IEEE division,
  round to nearest even); then y = dequantize(q) @ dequantize(w)^T (+ bias) in float32.
- Fused activation quantization (kernels/fp8_fused.py): RMSNorm (+ residual) or SiLU-and-mul
  emitting the w8a8 GEMM's input directly, an `Fp8Activation`; the references are literally the
  unfused ones in sequence (the norm / SiLU rounded to the dtype, then
  quantize_activations_reference), so the fused w8a8 model computes what the unfused one did.
Also the host-side path choice (`fp8_path`, `fused_quant_group`): ints only, no triton.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.reference import rms_norm_reference, silu_and_mul_reference

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_MIN_SCALE = 1e-12  # activation scales never go below this (an all-zero row quantizes to zeros)
W8A16_MAX_M = 64  # the most rows the weight-only kernel takes (kernels/fp8_gemm.py)
FUSED_MAX_K = 32768  # the fused norm / SiLU quantization holds a whole row in registers


class Fp8Activation(NamedTuple):
    """Activations already quantized for the w8a8 GEMM: q [M, K] float8_e4m3fn, scale [M, groups]
    float32 (per token, or per token and group of columns), dtype: the GEMM's output dtype (the
    activations' own before quantization). kernels.fp8_linear takes it in place of x."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


def pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two dividing n, at most cap."""
    return min(n & -n, cap)


def fp8_path(m: int, dtype: torch.dtype, strategy: str, block) -> str:
    """Which path M rows take on CUDA (host ints only): "w8a16", "w8a8" or "dequantize"."""
    bk = pow2_divisor(block[1], 1 << 30) if strategy == "block" else 1 << 30
    if 1 <= m <= W8A16_MAX_M:
        return "w8a16" if bk >= 16 else "dequantize"
    return "w8a8" if dtype != torch.float32 and bk >= 32 and m > 0 else "dequantize"


def fused_quant_group(m: int, dtype: torch.dtype, strategy: str, block, k: int) -> int | None:
    """The activation group size when M rows of `dtype` feeding a [N, K] FP8 linear take the w8a8
    path and the kernel before it can quantize them (a whole row of K <= FUSED_MAX_K; block
    weights: bk a power of two); None otherwise (that linear takes its input in `dtype`)."""
    if fp8_path(m, dtype, strategy, block) != "w8a8" or k > FUSED_MAX_K:
        return None
    group = activation_group_size(strategy, block, k)
    return group if group == k or group & (group - 1) == 0 else None


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
    # amax / 448 correctly rounded, as the kernel's div_rn: a CUDA tensor divided by a Python
    # scalar is computed as a * (1 / b), one bit off for some amax (the test caught it on the H200)
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(FP8_MIN_SCALE)
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
    q, x_scale = quantize_activations_reference(x, activation_group_size(strategy, block, x.shape[1]))
    return w8a8_quantized_linear_reference(Fp8Activation(q, x_scale, x.dtype), weight, scale, strategy, block, bias)


def w8a8_quantized_linear_reference(x: Fp8Activation, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                                    block: tuple[int, int] | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The w8a8 product of activations already quantized: float32, rounded once to x.dtype."""
    k = x.q.shape[1]
    group = activation_group_size(strategy, block, k)
    xq = x.q.float() * x.scale.repeat_interleave(group, dim=1)[:, :k]
    y = xq @ dequantize_fp8_reference(weight, scale, strategy, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def rms_norm_quant_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                             group_size: int | None = None):
    """rms_norm_reference (rounded to x's dtype), then quantize_activations_reference per group of
    columns (None: the whole row): Fp8Activation, or (Fp8Activation, new residual) with residual."""
    out = rms_norm_reference(x, weight, eps, residual)
    y, new_residual = out if residual is not None else (out, None)
    act = Fp8Activation(*quantize_activations_reference(y, group_size or y.shape[1]), x.dtype)
    return act if residual is None else (act, new_residual)


def silu_and_mul_quant_reference(x: torch.Tensor, group_size: int | None = None) -> Fp8Activation:
    """silu_and_mul_reference (rounded to x's dtype), then quantize_activations_reference."""
    y = silu_and_mul_reference(x)
    return Fp8Activation(*quantize_activations_reference(y, group_size or y.shape[1]), x.dtype)
