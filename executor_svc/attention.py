"""AttentionMetadata: everything attention needs about one step, passed explicitly to the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Per-step attention inputs (device tensors, views into the static buffers).

    Tokens of the step lie back to back, request after request: request i owns tokens
    query_start_loc[i]:query_start_loc[i+1]. Padded rows (graph replay) have seq_len 0
    and write their KV to slot -1 (skipped) or into the null block 0.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each token's K/V (-1 = skip)
    block_tables: torch.Tensor  # [B, max_blocks] int32: KV blocks of each request (0 = unused)
    seq_lens: torch.Tensor  # [B] int32: context length after this step (0 = padded row)
    query_start_loc: torch.Tensor  # [B + 1] int32: offsets of each request's tokens
    max_query_len: int  # host upper bound of the per-request token count (no device sync)
    max_seq_len: int  # host upper bound of seq_lens
    is_decode: bool  # every request has exactly one token: T == B, decode kernel
    logits_indices: torch.Tensor | None = None  # [N] int64: tokens whose logits are sampled
