"""Step preparation on the host: the inputs of one step, written into the static host buffers
with whole-array numpy operations over the scheduled rows (no per-request Python work, except
copying the known tokens of prefill chunks).

Tokens of a request in this step, positions start..end:
    |-- known (sent by the scheduler) --|-- last sampled (device) --|
    start                          num_known                       end
The second region is at most one token (a decode row: n == 1, nothing known), whose input is
gathered on the device from `last_sampled_gpu` (use_last), so decode rows copy no tokens.
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
    """Host facts about the prepared step (device data lives in the StepBuffers)."""

    num_reqs: int
    num_tokens: int
    num_sample: int
    sample_rows: np.ndarray  # [N] int64: rows that sample, in plan order (a copy)
    max_query_len: int
    max_seq_len: int
    all_greedy: bool
    need_top_k_top_p: bool
    need_processors: bool = False  # some sampled row uses a logits processor
    need_penalties: bool = False  # some sampled row needs its generated-token counts kept
    num_logprobs: int = -1  # -1: no sampled row wants logprobs; else the most top-k asked
    prompt_logprobs: PromptLogprobRows | None = None  # rows computing prompt logprobs

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == self.num_reqs


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


@dataclass(frozen=True)
class StepLimits:
    """What one step and one request may hold (plans are checked against them in plan_checks)."""

    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_tokens: int


def prepare_step(batch: InputBatch, buf: StepBuffers, sched: Scheduled, lim: StepLimits) -> PreparedStep:
    """Writes the step's inputs into the selected host set of `buf` and advances the rows'
    num_computed. The step comes from a checked plan (plan_checks.check_plan: within the
    step limits, no duplicate row, every chunk within its blocks, max_model_len and its known
    tokens + 1), so nothing here can fail half-way."""
    rows, n = sched.rows, sched.counts
    b, t = len(rows), int(n.sum())
    start = batch.num_computed[rows]
    end = start + n
    known = batch.num_known[rows]
    k = np.maximum(np.minimum(end, known) - start, 0)  # known tokens in each chunk

    bs = lim.block_size
    cu = np.cumsum(n)
    qsl = buf.query_start_loc.np
    qsl[0] = 0
    qsl[1:b + 1] = cu
    buf.seq_lens.np[:b] = end
    np.take(batch.block_table, rows, axis=0, out=buf.block_tables.np[:b])
    if t == b:  # every row computes one token: token i is row i
        pos, src = start, rows
    else:
        pos = np.arange(t, dtype=np.int64) + np.repeat(start - (cu - n), n)
        src = np.repeat(rows, n)
    buf.positions.np[:t] = pos
    buf.src_rows.np[:t] = src
    buf.slot_mapping.np[:t] = batch.block_table[src, pos // bs].astype(np.int64) * bs + pos % bs
    use_last = buf.use_last.np
    use_last[:t] = False
    use_last[cu[k < n] - 1] = True  # the lone unknown token of a decode row
    ids = buf.input_ids.np
    ids[:t] = 0
    for i in np.flatnonzero(k).tolist():  # prefill chunks only
        s, m, off = int(start[i]), int(k[i]), int(cu[i] - n[i])
        ids[off:off + m] = batch.states[rows[i]].token_ids[s:s + m]

    samp = np.flatnonzero(end >= known)  # completed the known tokens: sample at position `end`
    ns = len(samp)
    srows = rows[samp]
    buf.logits_indices.np[:ns] = cu[samp] - 1
    buf.sample_rows.np[:ns] = srows
    buf.sample_positions.np[:ns] = end[samp]
    temps = buf.temperature.np[:ns]
    temps[:] = batch.temperature[srows]
    buf.top_k.np[:ns] = batch.top_k[srows]
    buf.top_p.np[:ns] = batch.top_p[srows]
    buf.seeds.np[:ns] = batch.seed[srows]
    cutting = (buf.top_k.np[:ns] > 0) | (buf.top_p.np[:ns] < 1.0)
    rs = batch.sampling
    need_processors = bool(rs.uses_processors[srows].any())
    if need_processors:  # the per-row parameters of the processors (else never read)
        buf.min_p.np[:ns] = rs.min_p[srows]
        buf.presence.np[:ns] = rs.presence[srows]
        buf.frequency.np[:ns] = rs.frequency[srows]
        buf.repetition.np[:ns] = rs.repetition[srows]
        buf.min_pos.np[:ns] = rs.min_pos[srows]
    prompt_rows = None
    if (rs.prompt_logprobs[rows] >= 0).any():
        prompt_rows = _prompt_logprob_rows(batch, rows, start, end, cu - n)

    batch.num_computed[rows] = end
    return PreparedStep(b, t, ns, srows, int(n.max()), int(end.max()),
                        all_greedy=not temps.any(), need_top_k_top_p=bool((cutting & (temps > 0)).any()),
                        need_processors=need_processors,
                        need_penalties=bool(rs.uses_penalties[srows].any()),
                        num_logprobs=int(rs.logprobs[srows].max(initial=-1)), prompt_logprobs=prompt_rows)


def _prompt_logprob_rows(batch: InputBatch, rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                         offsets: np.ndarray) -> PromptLogprobRows | None:
    """The prompt positions p (1 <= p < prompt_len) whose predicting token p - 1 this step
    computes, for the rows that asked (Python per such row: prefill chunks only)."""
    rs = batch.sampling
    req_ids, firsts, counts, indices, targets, num_top = [], [], [], [], [], 0
    for i in np.flatnonzero(rs.prompt_logprobs[rows] >= 0).tolist():
        row = int(rows[i])
        lo, hi = int(start[i]) + 1, min(int(end[i]), int(rs.prompt_len[row]) - 1)  # p in [lo, hi]
        if hi < lo:
            continue
        state = batch.states[row]
        req_ids.append(state.req_id)
        firsts.append(lo)
        counts.append(hi - lo + 1)
        indices.append(np.arange(lo - 1, hi, dtype=np.int64) - int(start[i]) + int(offsets[i]))
        targets.append(state.token_ids[lo:hi + 1])
        num_top = max(num_top, int(rs.prompt_logprobs[row]))
    if not req_ids:
        return None
    return PromptLogprobRows(req_ids, firsts, counts, np.concatenate(indices),
                             np.concatenate(targets).astype(np.int64), num_top)
