"""Logprobs of one step on their way to the host: computed on the device, copied non-blocking
into pinned host tensors when the step is launched, read as lists when it is finished."""

from __future__ import annotations

import torch

from executor_svc.sample.logits_processors import LogprobsOut, compute_logprobs
from executor_svc.sample.rows import to_device
from executor_svc.worker.step_inputs import PromptLogprobRows
from step_protocol.domain import Logprobs, PromptLogprobs

PROMPT_CHUNK = 256  # prompt positions per logits matmul: bounds the [chunk, V] float32 temporaries


class PendingLogprobs:
    """Enqueued copies of n rows' logprobs (the first k alternatives of each); result() after
    the step's completion event."""

    def __init__(self, out: LogprobsOut, k: int):
        self.k = max(k, 0)
        self._host = [_to_host(t) for t in (out.logprobs, out.ranks, out.top_ids[:, :self.k],
                                            out.top_logprobs[:, :self.k])]

    def result(self, token_ids: list[int]) -> Logprobs:
        lps, ranks, top_ids, top_lps = self._host
        return Logprobs(self.k, list(token_ids), lps.tolist(), ranks.tolist(),
                        top_ids.flatten().tolist(), top_lps.flatten().tolist())


class PendingPromptLogprobs:
    """The prompt logprobs of a step, enqueued like PendingLogprobs."""

    def __init__(self, rows: PromptLogprobRows, out: LogprobsOut):
        self.rows = rows
        self.values = PendingLogprobs(out, rows.num_top)

    def result(self) -> PromptLogprobs:
        r = self.rows
        return PromptLogprobs(list(r.req_ids), list(r.first_positions), list(r.counts),
                              self.values.result(r.target_ids.tolist()))


def prompt_logprobs(compute_logits, hidden: torch.Tensor, rows: PromptLogprobRows) -> PendingPromptLogprobs:
    """Logprobs of the prompt positions in `rows`: the logits of their predicting tokens'
    hidden states ([T, H] of the step), PROMPT_CHUNK positions at a time."""
    device = hidden.device
    indices = to_device(rows.token_indices, device)
    targets = to_device(rows.target_ids, device)
    parts = []
    for i in range(0, len(rows.target_ids), PROMPT_CHUNK):
        logits = compute_logits(hidden[indices[i:i + PROMPT_CHUNK]])
        parts.append(compute_logprobs(logits, targets[i:i + PROMPT_CHUNK], rows.num_top))
    out = LogprobsOut(*(torch.cat([getattr(p, f) for p in parts])
                        for f in ("logprobs", "ranks", "top_ids", "top_logprobs")))
    return PendingPromptLogprobs(rows, out)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if not t.is_cuda:
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
