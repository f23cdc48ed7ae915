"""Logprobs of one step on their way to the host: computed on the device, copied non-blocking
into pinned host tensors when the step is launched, read as lists when it is finished; and the
prompt positions whose logprobs a step computes (prompt_logprob_rows)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from executor_svc.sample.logits_processors import LogprobsOut, compute_logprobs
from executor_svc.sample.rows import SamplingRows
from executor_svc.worker.host_device import to_device, to_host
from step_protocol.domain import Logprobs, PromptLogprobs

PROMPT_CHUNK = 256  # prompt positions per logits matmul: bounds the [chunk, V] float32 temporaries


@dataclass
class PromptLogprobRows:
    """Prompt positions whose logprobs this step computes (prefill chunks of requests that
    asked): request i gets counts[i] positions from first_positions[i]; flat, the logits of
    token_indices[j] give the logprob of target_ids[j]. num_top = the most top-k asked."""

    req_ids: list[int]
    first_positions: list[int]
    counts: list[int]
    token_indices: np.ndarray  # [M] int64 index into the step's tokens
    target_ids: np.ndarray  # [M] int64
    num_top: int


def prompt_logprob_rows(state: SamplingRows, requests: list, rows: np.ndarray, start: np.ndarray,
                        end: np.ndarray, offsets: np.ndarray) -> PromptLogprobRows | None:
    """The prompt positions p (1 <= p < prompt_len) whose predicting token p - 1 this step
    computes, for the rows that asked (Python per such row: prefill chunks only). requests:
    the RequestState by row (req_id, token_ids); rows / start / end / offsets: the step's
    chunks (persistent row, first and end position, first token index in the step)."""
    asked = state.prompt_logprobs[rows] >= 0
    if not asked.any():
        return None
    req_ids, firsts, counts, indices, targets, num_top = [], [], [], [], [], 0
    for i in np.flatnonzero(asked).tolist():
        row = int(rows[i])
        lo, hi = int(start[i]) + 1, min(int(end[i]), int(state.prompt_len[row]) - 1)  # p in [lo, hi]
        if hi < lo:
            continue
        request = requests[row]
        req_ids.append(request.req_id)
        firsts.append(lo)
        counts.append(hi - lo + 1)
        indices.append(np.arange(lo - 1, hi, dtype=np.int64) - int(start[i]) + int(offsets[i]))
        targets.append(request.token_ids[lo:hi + 1])
        num_top = max(num_top, int(state.prompt_logprobs[row]))
    if not req_ids:
        return None
    return PromptLogprobRows(req_ids, firsts, counts, np.concatenate(indices),
                             np.concatenate(targets).astype(np.int64), num_top)


class PendingLogprobs:
    """Enqueued copies of n rows' logprobs (the first k alternatives of each); result() after
    the step's completion event."""

    def __init__(self, out: LogprobsOut, k: int):
        self.k = max(k, 0)
        self._host = [to_host(t) for t in (out.logprobs, out.ranks, out.top_ids[:, :self.k],
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
