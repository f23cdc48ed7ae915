"""Speculative decoding on the executor: verify rows and the verification rule.

A verify row is a cached row with d draft tokens (StepPlan.num_draft_tokens): it computes
1 + d tokens, its last sampled token (fed from the device, as a decode row's) then the drafts,
like a prefill chunk. The logits of its first d positions score the drafts; its last position
is sampled as any row's (the bonus token). The rule (match_drafts): at each position the row
draws its token exactly as a decode step would (the sampler's Gumbel-max with the noise of
(seed, position); greedy: the argmax), and draft j is accepted iff it equals that draw; the
row's token is the draw where it stops, or the bonus. The tokens are therefore the tokens of
speculation off, bit for bit when the logits are (--deterministic, docs/deterministic.md), and
distributed as the target's; a draft is accepted with probability p(d_j), as under the classic
rejection rule for a point-mass draft (u < p(d_j), then a draw from max(p - q, 0)), which
spent another uniform per position and gave different tokens than speculation off.

The row answers its accepted drafts and that one token. Its num_computed was advanced over all
1 + d tokens at launch; the rejected drafts' slots are given back when the step is finished
(Rollbacks, applied at the next launch). The Verifier owns what verification keeps across
steps (the rows' chain flags, the pending rollbacks); a step's VerifyRows are made once, by
Verifier.prepare, and never written after; verify() answers a VerifyOutcome. A verify step of
decode and verify rows that fits a decode graph runs as token rows (worker/step_inputs.py: each
token a decode row) and replays that decode graph — if its rows sample plainly, with its tail (the
samples, the rejection rule, the scan) one more replay (verify_tail.py) —; others replay mixed CUDA graphs
(worker/cuda_graphs.py: their hidden states are kept) or run eagerly when larger than the largest.

Chained verify rows (StepPlan.draft_chained; docs/scheduler.md, "Verify rows that keep the
pipeline"): the scheduler may plan a request's next verify row while its verify row is still in
flight, assuming that row accepts every draft, so its positions follow the in-flight row's last
draft and its first input is that row's token (read on the device, as any decode row's). Each
verify row writes a per-row device flag (Verifier.chain_ok), chain_ok = "I accepted every draft, and my chain was
valid"; a chained row whose flag reads false is void: it keeps the row's last token as it was
before the sampler wrote (prev_last), answers no token and gives back all its 1 + d slots. Its
KV writes land past the request's true length (every rollback applied before it only gives back
slots known to be void), where they are overwritten when those positions are computed again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

import kernels
from executor_svc.sample.ops import SamplingTensors, sample
from executor_svc.sample.sampler import Sampled, Sampler
from executor_svc.spec_decode.verify_tail import (RANDOM, TailOutcome, VerifyTail, tail_result,
                                                  write_segments)
from executor_svc.worker.cuda_graphs import GraphRunner
from executor_svc.worker.staged import PinnedOut, Staged
from executor_svc.worker.input_batch import InputBatch, RequestState
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import Scheduled


def match_drafts(logits: torch.Tensor, draft_ids: torch.Tensor,
                 params: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification rule for point-mass drafts, M positions at once (a pure function):
    (accepted [M] bool, drawn [M] int64), drawn = the sampler's own draw at each position
    (ops.sample: the argmax on greedy rows, else Gumbel-max with the noise of (seed, position)
    over the row's scaled and cut logits) and accepted = (drawn == draft)."""
    drawn = sample(logits, params)
    return drawn == draft_ids, drawn


@dataclass(frozen=True)
class VerifyRows:
    """The verify rows of one prepared step (host facts, plus their device tensors); made by
    Verifier.prepare, read only after."""

    states: list[RequestState]  # per verify row
    sample_index: np.ndarray  # [S] int64: its index among the step's sampled rows
    num_drafts: np.ndarray  # [S] int64
    # (the device columns below: None in a tail's step, but token_index and rows with a draft model)
    token_index: torch.Tensor | None  # [D] int64: the step's token predicting each draft
    draft_ids: torch.Tensor | None  # [D] int64 the plan's drafts; None: the draft model proposes them
    params: SamplingTensors | None  # per draft: the row's parameters, the drafted token's position
    draft_start: torch.Tensor | None  # [S] int64: the row's first draft among the D
    drafts_per_row: torch.Tensor | None  # [S] int64: num_drafts on the device
    rows: torch.Tensor | None  # [S] int64 persistent rows
    chained: torch.Tensor | None = None  # [S] bool: chained rows; None = none in this step
    logits_row: int | None = None  # the drafts' logits are the step's logits rows logits_row.. (+D); None: from hidden states
    parity: int = 0  # the step's host set (its outcome's pinned copies)
    offsets: np.ndarray | None = None  # [B] each request's first token: a tail's step (verify_tail.py); else None
    tail: str | None = None  # verify_tail.py's kind (GREEDY, RANDOM) of a tail's step

    @property
    def max_drafts(self) -> int:
        return int(self.num_drafts.max())

    @property
    def num_draft_logits(self) -> int:
        """Logits rows the step computes for the drafts beside its sampled rows."""
        return 0 if self.logits_row is None else int(self.num_drafts.sum())


@dataclass(frozen=True)
class VerifyOutcome:
    """What verify() decided for a step's verify rows (read after the step's completion event)."""

    # Host copies, enqueued non-blocking into pinned memory before the step's completion event
    # (read after it: result() makes no device sync); final stays on the device.
    tokens: torch.Tensor  # [S, Dmax + 1]: accepted drafts, then the row's token
    num_accepted: torch.Tensor  # [S]
    final: torch.Tensor  # [S] each row's last token now (the next step's input), on the device
    valid: torch.Tensor | None = None  # [S] bool: not void (chained rows whose chain held)


class Verifier:
    """Verification across steps: the rows' chain flags (device) and the rejected drafts'
    slots still to give back (Rollbacks)."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, buffers: StepBuffers, sampler: Sampler,
                 graphs: GraphRunner | None = None):
        device = buffers.device
        # Per row: whether its last verify row (and every row of its chain) accepted every
        # draft; read by a chained verify row, written by every verify row.
        self.chain_ok = torch.zeros(max_num_seqs + 1, dtype=torch.bool, device=device)
        # the tail of token-rows steps whose rows sample plainly (verify_tail.py)
        self.tail = VerifyTail(buffers, sampler.inputs, sampler.last_tokens, self.chain_ok, max_num_seqs)
        if graphs is not None and device.type == "cuda":  # captured per decode size, after the decode graphs
            self.tail.capture(graphs.logits, graphs.sizes, graphs.pool)
        self.rollbacks = Rollbacks()
        self.max_num_seqs = max_num_seqs
        # a step's columns: 5 per draft and 1 per row of 8 bytes, 2 per draft of 4, 1 per row of 1
        self._staged = Staged(max_num_tokens * 48 + max_num_seqs * 33 + 16 * 12, device)
        self._row_index = np.zeros(max_num_seqs + 1, dtype=np.int64)  # scratch: a row's index among the sampled
        # the outcome's host copies: tokens (~ a draft or row each), accepted counts, validity
        self._out = PinnedOut(max_num_tokens * 8 + max_num_seqs * 24 + 64, device)

    def prepare(self, batch: InputBatch, sampler: Sampler, buf: StepBuffers, sched: Scheduled,
                draft_token_ids: list[int], sample_rows: np.ndarray, parity: int,
                tail: str | None = None) -> VerifyRows:
        """Writes the drafts of the verify rows (sched.drafts [B] > 0, plan order) into the host
        input buffers (the row's first token is its last sample, the rest its drafts), and, when
        the step's logits rows can hold them (at most max_num_seqs in all: a mixed graph's
        rows), the drafts' token indices after the sampled rows' in logits_indices; call after
        prepare_step, before the copy to the device. No draft_token_ids (a draft model proposes,
        draft.py): the drafts are written on the device later, and its draft ids come from there.
        tail: a token-rows step's verify_tail.tail_kind (the runner's word): with at most
        TOKEN_ROWS_MAX_DRAFTS drafts a request it takes that tail, and only its segments, for a
        RANDOM tail the Sampler's columns a token row each (sampler.prepare again), and for a
        draft model the drafts' token index and rows are written."""
        rows, counts, num_drafts = sched.rows, sched.counts, sched.drafts
        idx = np.flatnonzero(num_drafts)
        d = num_drafts[idx]
        cu = np.cumsum(counts)
        offsets = (cu - counts)[idx]  # the row's first token in the step
        drafts = np.asarray(draft_token_ids, dtype=np.int64)
        vrows = rows[idx]
        starts = batch.num_computed[vrows] - counts[idx]  # prepare_step advanced them already
        # The first token is the last sample (a decode row) or the last known token (the end of
        # a prefill: prepare_step wrote it); drafts follow.
        ends = np.cumsum(d)
        rep = np.repeat(np.arange(len(idx)), d)
        within = np.arange(int(ends[-1])) - np.repeat(ends - d, d)
        token_index = offsets[rep] + within  # the token predicting each draft; the draft is next
        use_last, ids = buf.use_last.np, buf.input_ids.np
        use_last[token_index + 1] = False
        use_last[offsets] = starts >= batch.num_known[vrows]
        if len(drafts):
            ids[token_index + 1] = drafts
        num_sample = len(sample_rows)
        chained = None if sched.chained is None else sched.chained[idx]
        if tail is not None and int(d.max()) <= kernels.TOKEN_ROWS_MAX_DRAFTS:
            num_tokens = int(cu[-1])
            write_segments(buf, cu - counts, num_drafts, sched.chained, num_tokens)
            if tail == RANDOM:  # each token row draws at the position after its input's
                sampler.prepare(buf.src_rows.np[:num_tokens], buf.positions.np[:num_tokens] + 1, parity)
            index_d = vrows_d = None
            if not len(drafts):  # the draft model writes its drafts at token_index + 1 (draft.py)
                index_d, vrows_d = self._staged.to_device([(token_index, np.int64), (vrows, np.int64)], parity)
            return VerifyRows([batch.states[r] for r in vrows.tolist()], idx, d, index_d, None, None, None, None,
                              vrows_d, logits_row=num_sample, parity=parity, offsets=cu - counts, tail=tail)
        logits_row = num_sample if num_sample + len(token_index) <= self.max_num_seqs else None
        if logits_row is not None:
            buf.logits_indices.np[num_sample:num_sample + len(token_index)] = token_index
        temperature, top_k, top_p, seeds = sampler.params_of(vrows[rep])
        positions = starts[rep] + within + 1
        self._row_index[sample_rows] = np.arange(num_sample)
        sample_index = self._row_index[vrows]
        random = temperature > 0
        i64, f32 = np.int64, np.float32
        (token_index_d, drafts_d, top_k_d, seeds_d, positions_d, start_d, d_d, vrows_d, temperature_d, top_p_d,
         chained_d) = self._staged.to_device(
            [(token_index, i64), (drafts, i64), (top_k, i64), (seeds, i64), (positions, i64), (ends - d, i64),
             (d, i64), (vrows, i64), (temperature, f32), (top_p, f32), (np.zeros(0) if chained is None else chained,
                                                                      np.bool_)], parity)
        params = SamplingTensors(temperature_d, top_k_d, top_p_d, seeds_d, positions_d,
                                 all_greedy=not random.any(),
                                 need_top_k_top_p=bool((random & ((top_k > 0) | (top_p < 1))).any()))
        return VerifyRows([batch.states[r] for r in vrows.tolist()], sample_index, d, token_index_d,
                          drafts_d if len(drafts) else None, params, start_d, d_d, vrows_d,
                          chained=None if chained is None else chained_d, logits_row=logits_row,
                          parity=parity)

    def run_tail(self, v: VerifyRows, logits: torch.Tensor, num_tokens: int,
                 graph_size: int) -> tuple[Sampled, tuple[VerifyRows, TailOutcome]]:
        """A tail's step (v.tail) after its forward: verify_tail.py's pass over its token rows'
        logits (or its graph of graph_size) -> what the step's handle keeps: every token row's
        token as its samples, and (v, outcome) for result()."""
        outcome = self.tail.launch(logits, num_tokens, graph_size, v.tail, v.parity)
        return Sampled(outcome.ids, None), (v, outcome)

    def verify(self, v: VerifyRows, logits: torch.Tensor, draft_ids: torch.Tensor, last_tokens: torch.Tensor,
               prev_last: torch.Tensor | None, greedy: torch.Tensor | None = None) -> VerifyOutcome:
        """Scores the drafts (logits [D, V] of v.token_index) and picks each row's tokens; its
        final token replaces the bonus token the sampler stored (last_tokens[v.rows]); records
        in chain_ok whether each row accepted every draft. A chained row whose chain_ok was
        false is void: its final token is prev_last (the row's last token before the sampler's
        write this step). The scan is one kernel (kernels.verify_scan). greedy: the argmax of
        `logits` computed already (every draft row greedy: the rule is then argmax == draft)."""
        if greedy is not None:
            accepted, recovered = greedy == draft_ids, greedy
        else:
            accepted, recovered = match_drafts(logits, draft_ids, v.params)
        tokens, num_accepted, final, valid = kernels.verify_scan(
            accepted, recovered, draft_ids, v.draft_start, v.drafts_per_row, v.rows, last_tokens, self.chain_ok,
            v.chained, prev_last, v.max_drafts)
        host = self._out.copy([tokens, num_accepted] + ([] if valid is None else [valid]), v.parity)
        return VerifyOutcome(host[0], host[1], final, host[2] if valid is not None else None)

    def result(self, v: VerifyRows, outcome: VerifyOutcome | TailOutcome,
               token_ids: list[int]) -> tuple[list[int], list[int]]:
        """(token ids, tokens per sampled row) of a finished step from its sampled ids (one per
        row) and its verify rows' outcome (its host copies: no device sync); registers the
        rejected drafts' rollbacks."""
        if isinstance(outcome, TailOutcome):  # token_ids: every token row's (each request's, from its first)
            per_row = tail_result(v.offsets, token_ids, outcome.counts.tolist())
            emitted = [len(per_row[i]) for i in v.sample_index.tolist()]
            rejected = [int(n + 1 - e) for n, e in zip(v.num_drafts.tolist(), emitted)]  # (a void row: all)
        else:
            tokens, num_accepted = outcome.tokens.tolist(), outcome.num_accepted.tolist()
            valid = [True] * len(num_accepted) if outcome.valid is None else outcome.valid.tolist()
            per_row = [[t] for t in token_ids]
            rejected = []
            for i, a, n in zip(v.sample_index.tolist(), range(len(num_accepted)), v.num_drafts.tolist()):
                per_row[i] = tokens[a][:num_accepted[a] + 1] if valid[a] else []  # a void row: none
                rejected.append(int(n - num_accepted[a]) if valid[a] else int(n + 1))
        self.rollbacks.add(v.states, rejected)
        return [t for row in per_row for t in row], [len(row) for row in per_row]


class Rollbacks:
    """Rejected drafts' slots, found when a verify step is finished (any thread), given back
    to the rows at the next launch (the device thread) — if the row is still that request's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: list[tuple[RequestState, int]] = []

    def add(self, states: list[RequestState], num_rejected: list[int]) -> None:
        with self._lock:
            self._pending.extend(zip(states, num_rejected))

    def take(self, batch: InputBatch) -> list[tuple[int, int]]:
        """The (row, slots) to give back now (InputBatch.give_back): the pending ones whose row
        still holds the request (tensor parallelism: the other ranks give back the same,
        parallel/ranks.py)."""
        if not self._pending:
            return []
        with self._lock:
            pending, self._pending = self._pending, []
        return [(state.row, n) for state, n in pending if batch.states[state.row] is state]

    def clear(self) -> None:
        with self._lock:
            self._pending = []
