"""On-device sampling with per-row parameters; reproducible from (seed, position), no host sync.

Randomness: Gumbel-max. Row r samples argmax_j(logits[r, j] / T[r] + g[r, j]) with
g = -log(-log(u)), u in (0, 1) drawn from a counter-based hash of (seed, position, j) — no
torch.Generator, no state, so a step replays identically and can live inside a CUDA graph.

The hash (`_mix32`) works on 32-bit values held in int64 tensors; every multiplier is below
2**31, so no product overflows int64 and the result is the same on every device:
    x ^= x >> 16; x = (x * 0x7FEB352D) mod 2**32; x ^= x >> 15; x = (x * 0x2C1B3C6D) mod 2**32;
    x ^= x >> 16
    key  = mix(mix(mix(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ position)   per row
    bits = mix(mix(key ^ j) + j)                                        per (row, token j)
    u    = ((bits >> 9) + 0.5) / 2**23     23 random bits, so u < 1 exactly in float32
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row sampling parameters (device tensors, views into the static buffers)."""

    temperature: torch.Tensor  # [N] float32; 0 = greedy
    top_k: torch.Tensor  # [N] int64; 0 = off
    top_p: torch.Tensor  # [N] float32; 1 = off
    seeds: torch.Tensor  # [N] int64 (a 63-bit seed)
    positions: torch.Tensor  # [N] int64: position of the token being sampled
    all_greedy: bool  # host flag: skip the random path
    need_top_k_top_p: bool  # host flag: some row cuts with top-k or top-p (sorting path)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """u [N, V] float32 in (0, 1): a pure function of (seed, position, token index)."""
    seed_lo, seed_hi = seeds & _M32, (seeds >> 32) & _M32
    key = _mix32(_mix32(_mix32(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ (positions & _M32))  # [N]
    j = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)  # [V]
    bits = _mix32((_mix32(key[:, None] ^ j[None, :]) + j[None, :]) & _M32)  # [N, V]
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Masks (-inf) tokens outside each row's top-k and nucleus top-p; logits [N, V] float32."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [N, V]
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    cut = rank >= k
    probs = sorted_logits.masked_fill(cut, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked tokens
    cut |= (mass_before >= top_p[:, None]) & (rank > 0)  # always keep the best token
    mask = torch.empty_like(cut).scatter_(-1, order, cut)
    return logits.masked_fill(mask, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """logits [N, V] float32 -> sampled token ids [N] int64 (greedy where temperature == 0)."""
    greedy = logits.argmax(dim=-1)
    if params.all_greedy:
        return greedy
    temperature = params.temperature.clamp_min(1e-5)[:, None]
    scaled = logits / temperature
    if params.need_top_k_top_p:
        scaled = apply_top_k_top_p(scaled, params.top_k, params.top_p)
    u = uniform_noise(params.seeds, params.positions, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(params.temperature > 0, sampled, greedy)
