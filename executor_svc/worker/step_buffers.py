"""The static inputs of a step: host buffers and their device twins, allocated once at the largest
size; a step writes the first rows on the host and copies them (non-blocking) to the device."""

from __future__ import annotations

import torch

from executor_svc.worker.host_device import Twin, TwinGroup, TwinSpec


class StepBuffers:
    """Static inputs of one step, allocated once at the largest size; a step fills the first rows.

    Per-token buffers and the block tables are copied row-prefix by row-prefix; the small
    per-request buffers live in one TwinGroup (`small`), copied whole at once. The columns of
    the rows that sample are the Sampler's (sample/inputs.py). T = tokens of the step, B = its
    requests, N = its requests that sample."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 device: torch.device):
        t, s, d = max_num_tokens, max_num_seqs, device
        self.max_num_seqs, self.max_num_tokens, self.device = max_num_seqs, max_num_tokens, device
        self.input_ids = Twin(t, torch.int64, d)  # [T] known input tokens
        self.use_last = Twin(t, torch.bool, d)  # [T] True: input is the row's last sampled token
        self.src_rows = Twin(t, torch.int64, d)  # [T] persistent row of each token's request
        self.positions = Twin(t, torch.int64, d)  # [T]
        self.slot_mapping = Twin(t, torch.int64, d, fill=-1)  # [T] -1 = do not write
        self.block_tables = Twin((s, max_blocks_per_seq), torch.int32, d)  # [B, max_blocks]
        self._own = (self.input_ids, self.use_last, self.src_rows, self.positions, self.slot_mapping,
                     self.block_tables)
        i32, i64 = torch.int32, torch.int64
        self.small = TwinGroup(d, [  # in the order of the assignment below
            TwinSpec(s, i32),  # seq_lens [B]
            TwinSpec(s + 1, i32),  # query_start_loc [B + 1]
            TwinSpec(s, i64),  # logits_indices [N]: token index of each sampled row
        ])
        self.seq_lens, self.query_start_loc, self.logits_indices = self.small.twins

    def use_host(self, i: int) -> None:
        """Selects host set i % 2 of every buffer (CUDA; a no-op on CPU, where one set is the device)."""
        for twin in self._own:
            twin.use_host(i)
        self.small.use_host(i)

    def pad(self, num_reqs: int, num_tokens: int, num_sample: int, reqs_to: int, tokens_to: int) -> None:
        """Makes tokens num_tokens..tokens_to harmless (no request, written nowhere), requests
        num_reqs..reqs_to empty (seq_len 0, no tokens) and logits rows num_sample..reqs_to
        read token 0 (the Sampler pads its rows: Sampler.pad)."""
        self.input_ids.np[num_tokens:tokens_to] = 0
        self.use_last.np[num_tokens:tokens_to] = False
        self.positions.np[num_tokens:tokens_to] = 0
        self.slot_mapping.np[num_tokens:tokens_to] = -1
        self.seq_lens.np[num_reqs:reqs_to] = 0
        self.block_tables.np[num_reqs:reqs_to] = 0
        self.query_start_loc.np[num_reqs + 1:reqs_to + 1] = self.query_start_loc.np[num_reqs]
        self.logits_indices.np[num_sample:reqs_to] = 0

    def copy_to_device(self, num_reqs: int, num_tokens: int) -> None:
        """Enqueues (non-blocking) the copy of what a step of num_reqs requests and num_tokens
        tokens reads: the first rows of the per-token buffers and block tables, `small` whole."""
        for twin in (self.input_ids, self.use_last, self.src_rows, self.positions, self.slot_mapping):
            twin.copy_to_device(num_tokens)
        self.block_tables.copy_to_device(num_reqs)
        self.small.copy_to_device()

    def input_tokens(self, last_sampled: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """[T] int64 device: the known token, or the row's last sampled token where use_last.
        last_sampled: [max_num_seqs + 1] int64 device (the Sampler's last_tokens)."""
        last = last_sampled[self.src_rows.gpu[:num_tokens]]
        return torch.where(self.use_last.gpu[:num_tokens], last, self.input_ids.gpu[:num_tokens])
