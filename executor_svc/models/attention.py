"""AttentionMetadata: everything attention needs about one step, passed explicitly to the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from executor_svc.worker.step_buffers import StepBuffers


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

    @classmethod
    def from_buffers(cls, buf: StepBuffers, num_reqs: int, num_tokens: int, max_query_len: int,
                     max_seq_len: int, num_sample: int | None = None,
                     is_decode: bool | None = None) -> AttentionMetadata:
        """Views of the first rows of the static device buffers (the caller has copied them):
        B = num_reqs, T = num_tokens, and N = num_sample rows of logits_indices when given.
        is_decode defaults to T == B (a mixed graph of T <= B tokens says False).
        The views keep their addresses from step to step, which is what a CUDA graph reads."""
        b, t = num_reqs, num_tokens
        return cls(
            slot_mapping=buf.slot_mapping.gpu[:t], block_tables=buf.block_tables.gpu[:b],
            seq_lens=buf.seq_lens.gpu[:b], query_start_loc=buf.query_start_loc.gpu[:b + 1],
            max_query_len=max_query_len, max_seq_len=max_seq_len,
            is_decode=t == b if is_decode is None else is_decode,
            logits_indices=None if num_sample is None else buf.logits_indices.gpu[:num_sample])
