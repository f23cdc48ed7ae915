"""The steady decode step: the rows of the last step again, one token each (issue 26, part 1).

At steady state most plans are exactly that: the same requests, in the same order, each one
more token, a few of them with a new block. For such a plan the general path (plan_checks,
plan_apply.admit, step_inputs.prepare_step) redoes work whose result it already has: the rows
of the request ids, the query offsets, source rows, use-last flags, logits indices and most of
the block tables are what the last step wrote into the step buffers' host arrays (one array
per member, host_device.PackedTwins: a step leaves its rows there). SteadyDecode remembers the
last pure decode step and, when the next plan repeats it, checks only what can differ (the new
blocks, each row's span) and writes only what moves (positions, seq lens, slots, the rows that
gained a block). Anything else, or a check that fails, takes the general path, which refuses
or fails rows exactly as before: this path never refuses anything itself.
"""

from __future__ import annotations

import numpy as np

from executor_svc.sample.sampler import Sampler
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_apply import Admitted
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import PreparedStep, Scheduled, StepLimits
from step_protocol.domain import ExecutorInfo, StepPlan


class SteadyDecode:
    """The last pure decode step (its request ids and rows), for the next plan to repeat."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._req_ids: list[int] | None = None  # of the last pure decode step, in plan order
        self._id_set: frozenset[int] = frozenset()
        self._rows: np.ndarray | None = None
        self._arange: np.ndarray | None = None
        self._version = 0  # a new one for every step it remembers or forgets

    @property
    def key(self) -> int | None:
        """Names the remembered rows until the next general step or reset (the sampler's
        columns of those rows are kept under it: sample/inputs.py); None: none remembered."""
        return None if self._req_ids is None else self._version

    def forget(self) -> None:
        """The step buffers or the rows may hold something else now (any other step, a reset,
        a failed launch): the next plan takes the general path."""
        self._req_ids = None
        self._version += 1

    def remember(self, plan: StepPlan, step: PreparedStep, scheduled: Scheduled, batch: InputBatch) -> None:
        """After the general path prepared the step of `plan` (the plan that runs): keeps it if
        it was a pure decode step of running requests (every row one token, fed from its last
        sample, and every row samples; no drafts), else forgets. A row whose one token was a
        known one (a prefill's last chunk) is not: its input id is in the buffers."""
        req_ids = plan.cached_requests.req_ids
        pure = (not plan.new_requests and scheduled.drafts is None and len(req_ids) == step.num_reqs
                and step.num_tokens == step.num_reqs == step.num_sample
                and bool((step.chunk_start >= batch.num_known[scheduled.rows]).all()))
        if not (self.enabled and pure):
            self.forget()
            return
        self._req_ids, self._rows = list(req_ids), scheduled.rows.copy()
        self._version += 1
        self._id_set = frozenset(req_ids)
        self._arange = np.arange(len(req_ids), dtype=np.int64)

    def admit(self, plan: StepPlan, batch: InputBatch, sampler: Sampler, info: ExecutorInfo) -> Admitted | None:
        """The plan applied to the rows when it repeats the last pure decode step and passes
        the checks of what can differ; None (nothing changed) otherwise. It may finish requests
        that are not among those rows (one whose last token was in flight sat out the last
        step; the step after says it finished): they are forgotten as plan_apply.admit does."""
        c = plan.cached_requests
        if (self._req_ids is None or plan.new_requests or plan.preempted_req_ids or plan.num_draft_tokens
                or plan.draft_token_ids or plan.draft_chained or c.req_ids != self._req_ids):
            return None  # (stray draft columns too: the general path refuses them)
        finished = plan.finished_req_ids
        if finished and not self._id_set.isdisjoint(finished):
            return None
        n = np.asarray(c.num_scheduled_tokens, dtype=np.int64)
        num_new_blocks = np.asarray(c.num_new_blocks, dtype=np.int64)
        if len(n) != len(c.req_ids) or len(num_new_blocks) != len(n) or (n != 1).any():
            return None
        rows = self._rows
        new_ids = np.asarray(c.new_block_ids, dtype=np.int64)
        if (num_new_blocks < 0).any() or int(num_new_blocks.sum()) != len(new_ids):
            return None
        if len(new_ids) and ((new_ids < 1) | (new_ids >= info.num_blocks)).any():
            return None
        start = batch.num_computed[rows]
        blocks = batch.num_blocks[rows] + num_new_blocks
        bad = ((blocks > batch.max_blocks_per_seq) | (start + 1 > np.minimum(blocks * info.block_size, info.max_model_len))
               | (start < batch.num_known[rows]))  # a lone decode token after the known ones
        if bad.any():
            return None
        for req_id in finished:  # (ids it does not hold are ignored, as the general path does)
            if (state := batch.requests.get(req_id)) is not None:
                sampler.remove(state.row)
            batch.remove(req_id)
        if len(new_ids):  # one in block_size steps a row crosses into a new block
            ends = np.cumsum(num_new_blocks)
            for i in np.flatnonzero(num_new_blocks).tolist():
                batch.append_blocks(batch.states[rows[i]], c.new_block_ids[int(ends[i] - num_new_blocks[i]):int(ends[i])])
        return Admitted(Scheduled(rows, n), plan, [], steady=num_new_blocks)

    def prepare(self, batch: InputBatch, buf: StepBuffers, admitted: Admitted, lim: StepLimits) -> PreparedStep:
        """Writes what moves since the last step into the host arrays (whose other rows hold
        the last step's values: same rows, one token each) and advances the rows."""
        rows, b = self._rows, len(self._rows)
        start = batch.num_computed[rows]
        end = start + 1
        gained = np.flatnonzero(admitted.steady)
        if len(gained):
            buf.block_tables.np[gained] = batch.block_table[rows[gained]]
        buf.positions.np[:b] = start
        buf.seq_lens.np[:b] = end
        bs = lim.block_size
        buf.slot_mapping.np[:b] = batch.block_table[rows, start // bs].astype(np.int64) * bs + start % bs
        batch.num_computed[rows] = end
        return PreparedStep(b, b, rows.copy(), end, 1, int(end.max()), chunk_start=start, token_offset=self._arange)
