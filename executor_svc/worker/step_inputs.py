"""Step preparation on the host: the inputs of one step, written into the static host buffers
with whole-array numpy operations over the scheduled rows (no per-request Python work, except
copying the known tokens of prefill chunks).

Tokens of a request in this step, positions start..end:
    |-- known (sent by the scheduler) --|-- last sampled (device) --|
    start                          num_known                       end
The second region is at most one token (a decode row: n == 1, nothing known), whose input is
gathered on the device from the Sampler's last_tokens (use_last), so decode rows copy no tokens.
A verify row's drafts are known inputs too (written by spec_decode/verify.py).

Token rows (prepare_step(..., token_rows=True), verify steps of decode and verify rows only): each
token is its own attention row, a decode row of the step: its seq_len is its position + 1 and its
block table its request's. A verify row of 1 + d tokens is then 1 + d decode rows sharing one
block table (its tokens' K/V are all written before any row attends, and each attends to its own
prefix: causal), so the step runs the decode attention kernel and replays a decode graph, the
same kernels as a decode step, instead of the varlen path of a mixed graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.step_buffers import StepBuffers


@dataclass
class Scheduled:
    """The rows a step computes, in plan order, and the tokens each computes (all > 0)."""

    rows: np.ndarray  # [B] int64 persistent rows
    counts: np.ndarray  # [B] int64 num_scheduled_tokens
    drafts: np.ndarray | None = None  # [B] int64 draft tokens of verify rows; None = none
    chained: np.ndarray | None = None  # [B] bool: chained verify rows (spec_decode/verify.py); None = none

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class PreparedStep:
    """Host facts about the prepared step (device data lives in the StepBuffers). The rows
    that sample (completed their known tokens) and the positions they sample at go to the
    Sampler; chunk_start / token_offset let it find prompt positions (prompt logprobs)."""

    num_reqs: int  # attention rows: the requests, or the tokens (token rows)
    num_tokens: int
    sample_rows: np.ndarray  # [N] int64: rows that sample, in plan order (a copy)
    sample_positions: np.ndarray  # [N] int64: the position each samples at
    max_query_len: int
    max_seq_len: int
    chunk_start: np.ndarray  # [B] int64: each row's first position in this step
    token_offset: np.ndarray  # [B] int64: each row's first token index in this step
    advance: np.ndarray | None = None  # [3, G] a steady step moved on the device (steady.py): its gained blocks

    @property
    def num_sample(self) -> int:
        return len(self.sample_rows)

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == self.num_reqs


@dataclass(frozen=True)
class StepLimits:
    """What one step and one request may hold (plans are checked against them in plan_checks)."""

    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_tokens: int


def prepare_step(batch: InputBatch, buf: StepBuffers, sched: Scheduled, lim: StepLimits,
                 token_rows: bool = False) -> PreparedStep:
    """Writes the step's inputs into the selected host set of `buf` and advances the rows'
    num_computed. The step comes from a checked plan (plan_checks.check_plan: within the
    step limits, no duplicate row, every chunk within its blocks, max_model_len and its known
    tokens + 1), so nothing here can fail half-way. token_rows: each token its own attention
    row (at most max_num_seqs tokens; see the module's docstring)."""
    rows, n = sched.rows, sched.counts
    start = batch.num_computed[rows]
    end = start + n
    known = batch.num_known[rows]
    t, cu, _ = write_chunks(batch, buf, rows, start, end, lim.block_size, token_rows)
    samp = np.flatnonzero(end >= known)  # completed the known tokens: sample at position `end`
    buf.logits_indices.np[:len(samp)] = cu[samp] - 1
    batch.num_computed[rows] = end
    return PreparedStep(t if token_rows else len(rows), t, rows[samp], end[samp], 1 if token_rows else int(n.max()),
                        int(end.max()), chunk_start=start, token_offset=cu - n)


def use_token_rows(sched: Scheduled, max_rows: int) -> bool:
    """Whether a step runs as token rows: a verify step (drafts) of at most max_rows tokens whose
    rows are decode and verify rows only (1 + drafts tokens each; a longer prefill chunk would
    read its context once per token)."""
    return (sched.drafts is not None and int(sched.counts.sum()) <= max_rows
            and bool((sched.counts <= sched.drafts + 1).all()))


def write_chunks(batch: InputBatch, buf: StepBuffers, rows: np.ndarray, start: np.ndarray,
                 end: np.ndarray, block_size: int, token_rows: bool = False) -> tuple[int, np.ndarray, np.ndarray]:
    """Writes the inputs of chunks (row i computes positions start[i]..end[i] - 1) into the
    host set of `buf`: query offsets, seq lens, block tables, positions, source rows, slots,
    known input ids, and use_last where a position is past the row's known tokens (its input
    is read on the device, from the row's last token; the draft points some of those at its
    carried drafts). The one chunk-input writer of the target's steps and the draft's
    catch-up (spec_decode/draft.py). token_rows: each token its own attention row (T rows).
    Returns (tokens, cumulative tokens per row, [T] positions)."""
    n = end - start
    b, t = len(rows), int(n.sum())
    known = batch.num_known[rows]
    cu = np.cumsum(n)
    if t == b:  # every row computes one token: token i is row i
        pos, src, unknown = start, rows, start >= known
    else:
        pos = np.arange(t, dtype=np.int64) + np.repeat(start - (cu - n), n)
        src = np.repeat(rows, n)
        unknown = pos >= np.repeat(known, n)
    qsl = buf.query_start_loc.np
    if token_rows and t != b:  # token i is attention row i, its request's blocks, its prefix
        qsl[:t + 1] = np.arange(t + 1)
        buf.seq_lens.np[:t] = pos + 1
        np.take(batch.block_table, src, axis=0, out=buf.block_tables.np[:t])
    else:
        qsl[0] = 0
        qsl[1:b + 1] = cu
        buf.seq_lens.np[:b] = end
        np.take(batch.block_table, rows, axis=0, out=buf.block_tables.np[:b])
    buf.positions.np[:t] = pos
    buf.src_rows.np[:t] = src
    buf.slot_mapping.np[:t] = batch.block_table[src, pos // block_size].astype(np.int64) * block_size + pos % block_size
    buf.use_last.np[:t] = unknown
    ids = buf.input_ids.np
    ids[:t] = 0
    k = np.maximum(np.minimum(end, known) - start, 0)  # known tokens in each chunk
    for i in np.flatnonzero(k).tolist():  # prefill chunks only
        s, m, off = int(start[i]), int(k[i]), int(cu[i] - n[i])
        ids[off:off + m] = batch.states[rows[i]].token_ids[s:s + m]
    return t, cu, pos
