"""Logits processors and logprobs on the device: fixed shapes, per-row parameters, no host sync.

Every function works on R rows of logits with per-row parameter tensors ([R]) and per-row
tables gathered by persistent row (SamplingRows): the same code runs eagerly (CPU, prefill
steps) and inside the captured sampler graphs (graphs.py). Neutral parameters are
exact no-ops (x / 1, x * 1, x - 0, + 0), so a row that uses nothing samples exactly what it
would without processors. Order, as vLLM V1: logit_bias and the min_tokens mask, then the
repetition penalty, then frequency and presence penalties; min_p (after temperature) last.

Logprobs are raw (vLLM's default `raw_logprobs`): log_softmax of the model's logits, before
any processor, temperature or top-k/top-p cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass
class ProcessorParams:
    """Per-row parameters of R sampled rows (device tensors, views of the static buffers)."""

    rows: torch.Tensor  # [R] int64 persistent rows (index the SamplingRows tables)
    positions: torch.Tensor  # [R] int64 position of the token being sampled
    temperature: torch.Tensor  # [R] float32
    min_p: torch.Tensor  # [R] float32
    presence: torch.Tensor  # [R] float32
    frequency: torch.Tensor  # [R] float32
    repetition: torch.Tensor  # [R] float32
    min_pos: torch.Tensor  # [R] int64: the stop ids are masked while position < min_pos


@dataclass
class ProcessorTables:
    """Per persistent row (max_num_seqs + 1: the last row is scratch for padded graph rows)."""

    counts: torch.Tensor  # [S + 1, V] int32: occurrences in the generated tokens
    prompt_mask: torch.Tensor  # [S + 1, V] bool: in the prompt (repetition penalty)
    bias_ids: torch.Tensor  # [S + 1, max_logit_bias] int64 (pad 0, with bias 0)
    bias_values: torch.Tensor  # [S + 1, max_logit_bias] float32
    stop_ids: torch.Tensor  # [S + 1, max_min_tokens_stop_ids] int64 (pad -1)


def apply_processors(logits: torch.Tensor, p: ProcessorParams, t: ProcessorTables,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [R, V] (any float dtype) -> processed float32 [R, V] (into `out` if given)."""
    # a copy: the raw logits stay as they were (logprobs are computed from them afterwards)
    x = logits.to(torch.float32, copy=True) if out is None else out.copy_(logits)
    rows = p.rows
    x.scatter_add_(1, t.bias_ids[rows], t.bias_values[rows])
    stop = t.stop_ids[rows]  # [R, K]
    masked = (p.positions < p.min_pos)[:, None] & (stop >= 0)
    x.scatter_add_(1, stop.clamp_min(0), torch.where(masked, NEG_INF, 0.0))
    counts = t.counts[rows]  # [R, V] int32
    seen = counts > 0
    rep = p.repetition[:, None]
    penalized = torch.where(x > 0, x / rep, x * rep)
    x = torch.where(seen | t.prompt_mask[rows], penalized, x)
    x = x - p.frequency[:, None] * counts - p.presence[:, None] * seen
    x = apply_min_p(x, p.min_p, p.temperature)
    return out.copy_(x) if out is not None else x


def apply_min_p(x: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Masks tokens whose probability at the row's temperature is below min_p times the top
    token's: p_i / p_max = exp((x_i - x_max) / T) < min_p  <=>  x_i < x_max + T * log(min_p).
    Greedy rows (T = 0) and min_p = 0 keep everything."""
    active = (temperature > 0) & (min_p > 0)
    offset = temperature * torch.log(min_p.clamp_min(1e-30))
    threshold = torch.where(active, x.amax(dim=-1) + offset, NEG_INF)
    return x.masked_fill(x < threshold[:, None], NEG_INF)


def count_tokens(counts: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
    """counts[rows[i], token_ids[i]] += 1 (rows are distinct within a step)."""
    counts.index_put_((rows, token_ids), torch.ones_like(token_ids, dtype=counts.dtype), accumulate=True)


@dataclass
class LogprobsOut:
    """Logprobs of R rows: of the given tokens, their ranks, and the top-K alternatives."""

    logprobs: torch.Tensor  # [R] float32
    ranks: torch.Tensor  # [R] int64, 1 = the most likely token
    top_ids: torch.Tensor  # [R, K] int64
    top_logprobs: torch.Tensor  # [R, K] float32


TIE_MARGIN = 16  # candidates beyond k that settle ties at the k-th value (top_k)


def top_k(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of lp [R, V] as (ids, values) [R, k], ties in index order.

    torch.topk's choice and order among equal values change with k and the kernel it picks
    (bf16 logits tie often): the logprobs graphs take max_logprobs and slice, an eager step takes
    its own k, and a row's top alternatives differed between the two (issue 28). Here k +
    TIE_MARGIN candidates are put in (value desc, index asc) order and the first k kept: the
    same ids whatever k, path or batch, unless more than TIE_MARGIN + 1 values tie at the k-th."""
    cand = lp.topk(min(lp.shape[-1], k + TIE_MARGIN), dim=-1)
    order = cand.indices.argsort(dim=-1)  # ascending index (indices are distinct)
    ids, values = cand.indices.gather(1, order), cand.values.gather(1, order)
    order = values.argsort(dim=-1, descending=True, stable=True)[:, :k]
    return ids.gather(1, order), values.gather(1, order)


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int,
                     out: LogprobsOut | None = None) -> LogprobsOut:
    """Raw logprobs of token_ids [R] under logits [R, V], and the top-k (k >= 0; top_k's
    order). With `out` (static tensors of the same shapes), writes there (the sampler graphs do)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, token_ids[:, None])  # [R, 1]
    ranks = (lp > chosen).sum(dim=-1) + 1
    top = top_k(lp, k) if k else None
    if out is None:
        empty = lp.new_empty(lp.shape[0], 0)
        return LogprobsOut(chosen[:, 0], ranks, top[0] if top else empty.long(), top[1] if top else empty)
    out.logprobs.copy_(chosen[:, 0])
    out.ranks.copy_(ranks)
    if top is not None:
        out.top_ids.copy_(top[0])
        out.top_logprobs.copy_(top[1])
    return out
