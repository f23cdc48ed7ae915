"""Building blocks of the model and the one place that picks the compute kernels.

Kernels come from `kernels`: Triton on CUDA tensors, the torch references otherwise.
Contract: docs/contracts.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kernels import (  # noqa: F401 - the kernels the model calls (docs/contracts.md)
    paged_attention,
    paged_decode_attention,
    rms_norm,
    rotary_embedding,
    rotary_write_kv,
    silu_and_mul,
    write_kv,
)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; forward(x, residual) fuses the residual add (returns both)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32, as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise NotImplementedError(f"rope type {rope_type!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin_cache(head_dim: int, max_positions: int, theta: float,
                       scaling: dict | None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    freqs = torch.arange(max_positions, dtype=torch.float32, device="cpu")[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)
