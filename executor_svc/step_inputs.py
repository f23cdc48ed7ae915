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

from executor_svc.input_batch import InputBatch
from executor_svc.step_buffers import StepBuffers


@dataclass
class Scheduled:
    """The rows a step computes, in plan order, and the tokens each computes (all > 0)."""

    rows: np.ndarray  # [B] int64 persistent rows
    counts: np.ndarray  # [B] int64 num_scheduled_tokens

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

    batch.num_computed[rows] = end
    return PreparedStep(b, t, ns, srows, int(n.max()), int(end.max()),
                        all_greedy=not temps.any(), need_top_k_top_p=bool((cutting & (temps > 0)).any()))
