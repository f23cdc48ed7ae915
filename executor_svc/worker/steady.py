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

Where the inputs are copied (CUDA: host_device.PackedTwins), what moves is moved on the device
instead (`advance`: one kernel, kernels.decode_advance): the device buffers still hold the last
step's inputs in the same layout, so the host writes nothing and copies only the ids of the
blocks rows gained (none in 15 of 16 steps of a row). The host arrays then fall behind; they
are caught up (`write_host`) only when a steady step has to be copied after all.
"""

from __future__ import annotations

import numpy as np
import torch

import kernels
from executor_svc.sample.sampler import Sampler
from executor_svc.worker.staged import Staged
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_apply import Admitted
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import PreparedStep, Scheduled
from step_protocol.domain import ExecutorInfo, StepPlan


class SteadyDecode:
    """The last pure decode step (its request ids and rows), for the next plan to repeat."""

    def __init__(self, enabled: bool, max_num_seqs: int, device: torch.device):
        self.enabled, self.max_num_seqs = enabled, max_num_seqs
        self._req_ids: list[int] | None = None  # of the last pure decode step, in plan order
        self._id_set: frozenset[int] = frozenset()
        self._rows: np.ndarray | None = None
        self._arange: np.ndarray | None = None
        self._version = 0  # a new one for every step it remembers or forgets
        self._host_behind = False  # the host arrays lack the device's advances (positions, slots, tables)
        self._gained = Staged(3 * 8 * max_num_seqs, device)  # (row, column, block id) of the gained blocks
        self._no_gain = torch.zeros(3, 1, dtype=torch.int64, device=device)[:, :0]
        self._no_advance = np.zeros((3, 0), dtype=np.int64)

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
        self._host_behind = False  # the general path wrote every input of these rows
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

    def prepare(self, batch: InputBatch, buf: StepBuffers, admitted: Admitted, block_size: int,
                on_device: bool) -> PreparedStep:
        """Writes what moves since the last step into the host arrays (whose other rows hold
        the last step's values: same rows, one token each) and advances the rows. on_device:
        writes nothing; the step's `advance` says what `advance` moves on the device."""
        rows, b = self._rows, len(self._rows)
        start = batch.num_computed[rows]
        end = start + 1
        step = PreparedStep(b, b, rows.copy(), end, 1, int(end.max()), chunk_start=start, token_offset=self._arange)
        counts = admitted.steady  # each row's gained blocks (admit appended them to the rows' tables)
        total = int(counts.sum())
        if on_device and total <= self.max_num_seqs:
            step.advance = self._no_advance
            if total:  # each gained block's (row, column, id): a row's k blocks are its last k columns
                k = counts[counts > 0]
                i = np.repeat(np.flatnonzero(counts), k)
                cols = batch.num_blocks[rows[i]] + np.arange(total) - np.repeat(np.cumsum(k), k)
                step.advance = np.stack([i, cols, batch.block_table[rows[i], cols].astype(np.int64)])
            self._host_behind = True
        else:
            self.write_host(batch, buf, step, block_size, np.flatnonzero(counts))
        batch.num_computed[rows] = end
        return step

    def write_host(self, batch: InputBatch, buf: StepBuffers, step: PreparedStep, block_size: int,
                   gained: np.ndarray | None = None) -> None:
        """Writes the steady `step`'s moving inputs into the host arrays: positions, seq lens,
        slots and the block tables of the rows that gained a block (`gained`; every row's when
        the host is behind the device, as it is when a step prepared on the device is copied)."""
        rows, b, start = self._rows, step.num_reqs, step.chunk_start
        if self._host_behind:
            buf.block_tables.np[:b] = batch.block_table[rows]
            self._host_behind = False
        elif gained is not None and len(gained):
            buf.block_tables.np[gained] = batch.block_table[rows[gained]]
        buf.positions.np[:b] = start
        buf.seq_lens.np[:b] = step.sample_positions
        buf.slot_mapping.np[:b] = (batch.block_table[rows, start // block_size].astype(np.int64) * block_size
                                   + start % block_size)
        step.advance = None

    def advance(self, buf: StepBuffers, step: PreparedStep, sample_positions: torch.Tensor | None,
                block_size: int, parity: int) -> None:
        """Moves the steady `step`'s inputs on the device (kernels.decode_advance): the device
        buffers hold the last step's, in this step's layout. sample_positions: the sampler's
        device column when it is not the host's (else the sampler wrote it already)."""
        g = step.advance
        gained = self._gained.to_device([(g, np.int64)], parity)[0] if g.shape[1] else self._no_gain
        kernels.decode_advance(buf.positions.gpu, buf.seq_lens.gpu, buf.slot_mapping.gpu, buf.block_tables.gpu,
                               sample_positions, gained, step.num_reqs, block_size, self.max_num_seqs)
