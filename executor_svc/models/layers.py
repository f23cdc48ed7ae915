"""Building blocks of the model and the one place that picks the compute kernels.

Kernels come from `kernels`: Triton on CUDA tensors, the torch references otherwise.
Contract: docs/contracts.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kernels import (  # noqa: F401 - the kernels the model calls (docs/contracts.md)
    SKINNY_MAX_M,
    linear_invariant,
    paged_attention,
    paged_decode_attention,
    rms_norm,
    rms_norm_linear,
    rms_norm_qkv_rope,
    rms_norm_quant,
    rotary_embedding,
    rotary_write_kv,
    silu_and_mul,
    silu_and_mul_quant,
    silu_mul_linear,
    skinny_linear,
    write_kv,
)


def use_skinny(x: torch.Tensor, max_tokens: int) -> bool:
    """Whether rows x [T, ...] take the skinny-GEMM path (kernels/skinny_gemm.py): CUDA tensors
    and 1 <= T <= min(max_tokens, SKINNY_MAX_M); max_tokens 0 = never. Depends on the device
    and host ints only, never on tensor values, so a CUDA graph records the path every replay
    of its size takes."""
    return x.is_cuda and 0 < x.shape[0] <= min(max_tokens, SKINNY_MAX_M)


def skinny_weight(linear: nn.Module):
    """What the skinny decode kernels read for `linear`: its weight, or an FP8 layer's
    kernels Fp8Weight (quantization/fp8.py Fp8Linear.skinny_weight)."""
    pick = getattr(linear, "skinny_weight", None)
    return pick() if pick is not None else linear.weight


def fp8_input_group(linear: nn.Module, x: torch.Tensor) -> int | None:
    """The activation group size when `linear` (an FP8 w8a8 layer at x's row count) takes its
    input quantized by the kernel before it (quantization/fp8.py Fp8Linear.input_quant_group),
    else None: x's dtype. Host ints only, so a CUDA graph records the choice every replay makes."""
    pick = getattr(linear, "input_quant_group", None)
    return pick(x) if pick is not None else None


def silu_and_mul_for(linear: nn.Module, gate_up: torch.Tensor):
    """silu_and_mul(gate_up), quantized in the same kernel when `linear` takes FP8 activations."""
    group = fp8_input_group(linear, gate_up)
    return silu_and_mul(gate_up) if group is None else silu_and_mul_quant(gate_up, group)


class InvariantLinear(nn.Linear):
    """nn.Linear (same parameters, same loading) whose output rows are each computed alone
    in effect: kernels.linear_invariant, every element summed the same way whatever the row
    count (--deterministic, docs/deterministic.md). pdl: launched as programmatic dependent launches
    (set by the model with --pdl)."""

    pdl = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_invariant(x, self.weight, self.bias, pdl=self.pdl)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; forward(x, residual) fuses the residual add (returns both).
    quant_group (fp8_input_group of the linear after it): emit an FP8 kernels Fp8Activation."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, quant_group: int | None = None):
        if quant_group is not None:
            return rms_norm_quant(x, self.weight, self.eps, residual, quant_group)
        return rms_norm(x, self.weight, self.eps, residual)


def rope_type(scaling: dict | None) -> str:
    """The rope type of a rope_parameters / rope_scaling dict (old configs say "type")."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None,
                  max_position_embeddings: int | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32, as transformers computes them at start-up.
    max_position_embeddings: the config's (yarn's factor when the dict has none)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    kind = rope_type(scaling)
    if kind in ("default", "dynamic"):  # dynamic: rescaled per position, rope_cos_sin_cache
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling, max_position_embeddings)
    raise NotImplementedError(f"rope type {kind!r} is not supported")


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


def _yarn_factor(s: dict, max_position_embeddings: int | None) -> float:
    factor = s.get("factor")
    if factor is None:  # transformers: the ratio of the two lengths
        factor = max_position_embeddings / s["original_max_position_embeddings"]
    return factor


def _yarn_inv_freq(dim: int, theta: float, s: dict, max_position_embeddings: int | None) -> torch.Tensor:
    """YaRN: interpolated (/ factor) low frequencies, original high ones, a linear ramp between
    the dims that turn beta_slow and beta_fast times over original_max_position_embeddings."""
    factor = _yarn_factor(s, max_position_embeddings)
    old_len = s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dim_of(turns: float) -> float:  # the dim whose wavelength fits `turns` times in old_len
        return dim * math.log(old_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: original frequency, 0: interpolated
    return interpolation * (1 - keep) + extrapolation * keep


def rope_attention_factor(scaling: dict | None, max_position_embeddings: int | None = None) -> float:
    """The factor transformers multiplies cos and sin by: yarn's mscale, else 1."""
    if rope_type(scaling) != "yarn":
        return 1.0
    factor = _yarn_factor(scaling, max_position_embeddings)
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]

    def mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)


def _dynamic_inv_freq(head_dim: int, theta: float, factor: float, max_position_embeddings: int,
                      positions: torch.Tensor) -> torch.Tensor:
    """[len(positions), head_dim // 2]: dynamic NTK frequencies of a forward whose last position
    is p (seq_len p + 1 > max_position_embeddings), in transformers' float32 tensor math, one
    position at a time (a batched pow rounds differently)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    rows = []
    for seq_len in (positions + 1).unbind():  # 0-dim int64, as torch.max(position_ids) + 1
        base = theta * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (head_dim / (head_dim - 2))
        rows.append(1.0 / (base ** exponents))
    return torch.stack(rows) if rows else torch.empty(0, head_dim // 2, device="cpu")


def rope_cos_sin_cache(head_dim: int, max_positions: int, theta: float, scaling: dict | None,
                       max_position_embeddings: int | None = None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second, both times
    the attention factor (yarn). max_position_embeddings: the config's (default max_positions).

    Dynamic NTK: transformers rescales inv_freq in each forward whose positions reach past
    max_position_embeddings, from that forward's last position. Positions before it get the
    default frequencies; a position p after it gets those of seq_len p + 1, what transformers'
    decode step computing p uses (exact for a sequence whose prompt fits max_position_embeddings;
    model_checks serves no longer context, so only tests build such rows)."""
    max_position_embeddings = max_position_embeddings or max_positions
    positions = torch.arange(max_positions, dtype=torch.int64, device="cpu")
    freqs = positions[:, None].float() * rope_inv_freq(head_dim, theta, scaling, max_position_embeddings)[None, :]
    if rope_type(scaling) == "dynamic" and max_positions > max_position_embeddings:
        beyond = positions[max_position_embeddings:]
        inv_freq = _dynamic_inv_freq(head_dim, theta, scaling["factor"], max_position_embeddings, beyond)
        freqs[max_position_embeddings:] = beyond[:, None].float() * inv_freq
    attention_factor = rope_attention_factor(scaling, max_position_embeddings)
    return torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)
