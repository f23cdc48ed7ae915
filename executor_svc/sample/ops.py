"""The sampling math: per-row parameters, on the device, reproducible from (seed, position), no
host sync (the Sampler, sampler.py, owns the rows and calls these; so does spec_decode/verify.py).

Randomness: Gumbel-max. Row r samples argmax_j(logits[r, j] / T[r] + g[r, j]) with
g = -log(-log(u)), u in (0, 1) drawn from a counter-based hash of (seed, position, j) — no
torch.Generator, no state, so a step replays identically and can live inside a CUDA graph.
The hash (`uniform_noise`) and the torch Gumbel-max are in kernels/reference.py; on CUDA
`kernels.gumbel_sample` is one fused Triton kernel (reads the logits once, noise in registers).
Top-k/top-p rows are cut first with a sort (torch), then sampled at temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels.reference import bitmask_allows
from kernels.reference import uniform_noise  # noqa: F401  (re-exported: the hash lives there)


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


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Masks (-inf) tokens outside each row's top-k and nucleus top-p; logits [N, V] float32."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [N, V]
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    cut = rank >= k
    probs = sorted_logits.masked_fill(cut, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked tokens
    # always keep the best token; a row without top-p cuts nothing here (with top_p = 1 the
    # cumulative sum may round to 1 before the last tokens: they would go, and a row's draw
    # would depend on whether another row of its step cuts)
    cut |= (mass_before >= top_p[:, None]) & (rank > 0) & (top_p[:, None] < 1)
    mask = torch.empty_like(cut).scatter_(-1, order, cut)
    return logits.masked_fill(mask, float("-inf"))


def sample(logits: torch.Tensor, params: SamplingTensors, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] (float32 or the model dtype) -> sampled token ids [N] int64 (greedy where
    temperature == 0); allowed: [N, words] int32, the tokens each row may sample (structured
    outputs' masks: a bit per token), or None."""
    temperature = params.temperature
    if params.all_greedy and not logits.is_cuda and allowed is None:
        return logits.argmax(dim=-1)  # the torch reference would draw noise only to ignore it
    if not params.need_top_k_top_p:
        # One fused pass over the logits on CUDA (its multi-program argmax also beats torch's
        # single-block argmax over a large vocabulary for greedy rows); the masks' bit test in it.
        return kernels.gumbel_sample(logits, temperature, params.seeds, params.positions, allowed)
    logits = logits.float()
    if allowed is not None:  # the cut below must see only the tokens the grammar allows
        logits = logits.masked_fill(~bitmask_allows(allowed, logits.shape[-1]), float("-inf"))
    # Cut the scaled logits, then sample at temperature 1 (x / 1 is exact, so this is the same
    # argmax as cutting and sampling in one place). Greedy rows take the argmax of the ORIGINAL
    # logits: the cut keeps one best token, but on tied maxima the sort may keep a later index,
    # and x / 1e-5 can round two close logits to a tie.
    random_rows = temperature > 0
    masked = scale_and_cut(logits, params)
    sampled = kernels.gumbel_sample(masked, random_rows.float(), params.seeds, params.positions)
    return torch.where(random_rows, sampled, logits.argmax(dim=-1))


def scale_and_cut(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """float32 logits [N, V] -> the distribution each row samples from, as logits: divided by
    the row's temperature (greedy rows by 1e-5), then cut to its top-k / top-p (when some row
    cuts). The sampler draws from it (and so does the verification rule, spec_decode/verify.py,
    through `sample`)."""
    scaled = logits / params.temperature.clamp_min(1e-5)[:, None]
    if params.need_top_k_top_p:
        scaled = apply_top_k_top_p(scaled, params.top_k, params.top_p)
    return scaled
