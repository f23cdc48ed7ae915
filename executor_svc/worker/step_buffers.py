"""The static inputs of a step: host arrays at the largest size, and their device views; a step
writes the first rows on the host and copies them all in one non-blocking copy."""

from __future__ import annotations

import torch

from executor_svc.worker.host_device import PackedSpec, PackedTwins

# name: what a step of B requests and T tokens copies of it (in this order, one packed copy)
_SPECS = {
    "input_ids": PackedSpec("tokens", torch.int64),  # [T] known input tokens
    "use_last": PackedSpec("tokens", torch.bool),  # [T] True: input is the row's last sampled token
    "src_rows": PackedSpec("tokens", torch.int64),  # [T] persistent row of each token's request
    "positions": PackedSpec("tokens", torch.int64),  # [T]
    "slot_mapping": PackedSpec("tokens", torch.int64, fill=-1),  # [T] -1 = do not write
    "seq_lens": PackedSpec("reqs", torch.int32),  # [B]
    "query_start_loc": PackedSpec("reqs", torch.int32, extra=1),  # [B + 1]
    "logits_indices": PackedSpec("tokens", torch.int64),  # [N (+ D) <= T]: token of each sampled row (then of each draft)
    "verify_segments": PackedSpec("tokens", torch.int32, fill=-2),  # [T] verify tails (spec_decode/verify_tail.py)
}


class StepBuffers:
    """Static inputs of one step, allocated once at the largest size; a step fills the first rows.

    Each member (input_ids, ..., block_tables) has `np`, its host array, and `gpu`, its device
    view in the layout of the last copy (host_device.PackedTwins: the first T or B rows of every
    member in one copy; a graph reads the layout of its shape). The columns of the rows that
    sample are the Sampler's (sample/inputs.py). T = tokens of the step, B = its requests,
    N = its requests that sample."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 device: torch.device, pack: bool | None = None):
        self.max_num_seqs, self.max_num_tokens, self.device = max_num_seqs, max_num_tokens, device
        specs = {**_SPECS, "block_tables": PackedSpec("reqs", torch.int32, row=max_blocks_per_seq)}  # [B, max_blocks]
        self.packed = PackedTwins(device, list(specs.values()), max_num_seqs, max_num_tokens, pack)
        for name, member in zip(specs, self.packed.members):
            setattr(self, name, member)

    def use_host(self, i: int) -> None:
        """Selects staging set i % HOST_SETS of the copy (CUDA; a no-op on CPU, where the host array is the device's)."""
        self.packed.use_host(i)

    def pad(self, num_reqs: int, num_tokens: int, num_logits: int, reqs_to: int, tokens_to: int) -> None:
        """Makes tokens num_tokens..tokens_to harmless (no request, written nowhere), requests
        num_reqs..reqs_to empty (seq_len 0, no tokens) and logits rows num_logits..reqs_to
        read token 0 (the Sampler pads its rows: Sampler.pad)."""
        self.input_ids.np[num_tokens:tokens_to] = 0
        self.use_last.np[num_tokens:tokens_to] = False
        self.positions.np[num_tokens:tokens_to] = 0
        self.slot_mapping.np[num_tokens:tokens_to] = -1
        self.seq_lens.np[num_reqs:reqs_to] = 0
        self.block_tables.np[num_reqs:reqs_to] = 0
        self.query_start_loc.np[num_reqs + 1:reqs_to + 1] = self.query_start_loc.np[num_reqs]
        self.logits_indices.np[num_logits:reqs_to] = 0
        self.verify_segments.np[num_tokens:tokens_to] = -2  # (no token: not a draft)

    def copy_to_device(self, num_reqs: int, num_tokens: int) -> None:
        """Enqueues (non-blocking) the one copy of what a step of num_reqs requests and
        num_tokens tokens reads: the first rows of every member."""
        self.packed.copy_to_device(num_reqs, num_tokens)

    def input_tokens(self, last_sampled: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """[T] int64 device: the known token, or the row's last sampled token where use_last.
        last_sampled: [max_num_seqs + 1] int64 device (the Sampler's last_tokens)."""
        last = last_sampled[self.src_rows.gpu[:num_tokens]]
        return torch.where(self.use_last.gpu[:num_tokens], last, self.input_ids.gpu[:num_tokens])
