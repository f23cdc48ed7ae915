"""Per-request sampling state, by persistent row: temperature, top-k, top-p, seed and the
logits processors' scalars (host: a step gathers them into the sampler's static inputs) and
the processors' tables (device: the processors gather them on the device). Written once when
a request gets its row, by the Sampler (sampler.py), which owns it.

A step that runs the processors runs them over every sampled row, and a row that uses none
relies on its neutral parameters being exact no-ops: its scalars are always written, and its
bias and stop-id tables must be neutral too (a bias table is added to the logits whatever the
scalars say; stop ids are masked while position < min_pos, and min_tokens without stop ids
uses no processor). A row remembers whether a request since its last reset wrote them
(`tables_set`); a request that uses no processor resets them then, so a row is never handed on
with the previous request's logit_bias or stop ids. Counts and the prompt mask need no reset:
neutral penalties make them no-ops, and a request with penalties rewrites both.

Host-to-device writes go through worker/host_device.py (pinned staging, non-blocking).
"""

from __future__ import annotations

import numpy as np
import torch

from executor_svc.sample.logits_processors import ProcessorTables
from executor_svc.worker.host_device import copy_into, to_device
from step_protocol.domain import NewRequestData


class SamplingRows:
    """Sampling parameters and processor scalars (host numpy, [S]) and the processors' tables
    (device, [S + 1, ...]) by persistent row."""

    def __init__(self, max_num_seqs: int, vocab_size: int, max_logit_bias: int,
                 max_stop_ids: int, device: torch.device):
        s, v = max_num_seqs, vocab_size
        self.device = device
        self.temperature = np.zeros(s, dtype=np.float32)  # 0 = greedy
        self.top_k = np.zeros(s, dtype=np.int64)  # 0 = off
        self.top_p = np.ones(s, dtype=np.float32)  # 1 = off
        self.seed = np.zeros(s, dtype=np.int64)  # a 63-bit seed
        self.min_p = np.zeros(s, dtype=np.float32)
        self.presence = np.zeros(s, dtype=np.float32)
        self.frequency = np.zeros(s, dtype=np.float32)
        self.repetition = np.ones(s, dtype=np.float32)
        self.min_pos = np.zeros(s, dtype=np.int64)  # stop ids masked while position < min_pos
        self.uses_processors = np.zeros(s, dtype=bool)
        self.uses_penalties = np.zeros(s, dtype=bool)  # needs its generated-token counts
        self.uses_grammar = np.zeros(s, dtype=bool)  # structured outputs: sampled under a mask (grammar.py)
        self.logprobs = np.full(s, -1, dtype=np.int64)  # -1 none, k >= 0: top-k
        self.prompt_logprobs = np.full(s, -1, dtype=np.int64)
        self.prompt_len = np.zeros(s, dtype=np.int64)
        self.tables_set = np.zeros(s, dtype=bool)  # the row's bias/stop tables may be non-neutral
        self.tables = ProcessorTables(
            counts=torch.zeros(s + 1, v, dtype=torch.int32, device=device),
            prompt_mask=torch.zeros(s + 1, v, dtype=torch.bool, device=device),
            bias_ids=torch.zeros(s + 1, max_logit_bias, dtype=torch.int64, device=device),
            bias_values=torch.zeros(s + 1, max_logit_bias, dtype=torch.float32, device=device),
            stop_ids=torch.full((s + 1, max_stop_ids), -1, dtype=torch.int64, device=device))

    def add(self, row: int, new: NewRequestData) -> None:
        """Sets the row of a request that was just given it (plan_checks checked the sizes)."""
        s = new.sampler_params
        prompt_len = new.prompt_len
        self.temperature[row], self.top_k[row], self.top_p[row] = s.temperature, s.top_k, s.top_p
        self.seed[row] = s.seed & 0x7FFFFFFFFFFFFFFF
        self.min_p[row], self.presence[row] = s.min_p, s.presence_penalty
        self.frequency[row], self.repetition[row] = s.frequency_penalty, s.repetition_penalty
        self.min_pos[row] = prompt_len + s.min_tokens
        self.uses_processors[row], self.uses_penalties[row] = s.uses_processors, s.uses_penalties
        self.uses_grammar[row] = bool(s.grammar)
        self.logprobs[row], self.prompt_logprobs[row] = s.logprobs, s.prompt_logprobs
        self.prompt_len[row] = prompt_len
        t = self.tables
        if not s.uses_processors:
            if self.tables_set[row]:  # the previous request's bias and stop ids: neutral again
                _set_padded(t.bias_ids[row], [], 0, torch.int64)
                _set_padded(t.bias_values[row], [], 0.0, torch.float32)
                _set_padded(t.stop_ids[row], [], -1, torch.int64)
                self.tables_set[row] = False
            return
        self.tables_set[row] = True  # before the writes: a write that raises leaves it set
        _set_padded(t.bias_ids[row], [tok for tok, _ in s.logit_bias], 0, torch.int64)
        _set_padded(t.bias_values[row], [b for _, b in s.logit_bias], 0.0, torch.float32)
        _set_padded(t.stop_ids[row], list(s.min_tokens_stop_ids), -1, torch.int64)
        if s.uses_penalties:
            ids = np.asarray(new.token_ids, dtype=np.int64)
            t.counts[row].zero_()
            generated = ids[prompt_len:]  # tokens generated before a preemption
            if len(generated):
                t.counts[row].index_add_(0, to_device(generated, self.device),
                                         torch.ones(len(generated), dtype=torch.int32, device=self.device))
            t.prompt_mask[row].zero_()
            if s.repetition_penalty != 1.0:
                t.prompt_mask[row].index_fill_(0, to_device(np.unique(ids[:prompt_len]), self.device), True)


def _set_padded(dst: torch.Tensor, values: list, pad, dtype: torch.dtype) -> None:
    """dst[:] = values followed by `pad` (one small non-blocking copy)."""
    host = torch.full((dst.shape[0],), pad, dtype=dtype)
    if values:
        host[:len(values)] = torch.tensor(values, dtype=dtype)
    copy_into(dst, host)
