"""References of the batch-invariant mode (--deterministic, docs/deterministic.md): each row's
result is computed by itself, so by construction it cannot depend on the other rows of its
step. They are the CPU path of that mode and the specification its Triton kernels are tested
against (kernels/gemm_invariant.py, attention_prefill.py with batch_invariant=True)."""

from __future__ import annotations

import torch

from kernels.reference_attention import paged_attention_reference


def linear_invariant_reference(
    x: torch.Tensor,  # [..., K]
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:
    """x @ w^T (+ bias), one row at a time: each a [1, K] x [K, N] product and bias add in
    float32, rounded once to x's dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    wt = w.float().t()
    b = None if bias is None else bias.float()
    rows = [(row[None].float() @ wt) if b is None else (row[None].float() @ wt + b) for row in x2]
    y = torch.cat(rows) if rows else x2.new_zeros(0, w.shape[0], dtype=torch.float32)
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])


def paged_attention_invariant_reference(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int
    seq_lens: torch.Tensor,  # [num_seqs] int
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int
    scale: float,
    sliding_window: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """paged_attention_reference with every new token as its own one-token request (its
    position's context, its request's blocks): a token's output is a function of its query and
    the keys it sees only, the same in prefill, chunked prefill, decode and verify."""
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    tables, token_lens = [], []
    for i, seq_len in enumerate(lens):
        q_len = starts[i + 1] - starts[i]
        for j in range(q_len):
            tables.append(block_tables[i])
            token_lens.append(seq_len - q_len + j + 1 if seq_len else 0)
    t = len(token_lens)
    if t == 0:
        return torch.zeros_like(q)
    one_each = torch.arange(t + 1, dtype=query_start_loc.dtype, device=q.device)
    out = paged_attention_reference(
        q[starts[0]:starts[0] + t], k_cache, v_cache, torch.stack(tables),
        torch.tensor(token_lens, dtype=seq_lens.dtype, device=q.device), one_each, scale,
        sliding_window, k_scale, v_scale)
    return torch.cat([torch.zeros_like(q[:starts[0]]), out, torch.zeros_like(q[starts[0] + t:])])
