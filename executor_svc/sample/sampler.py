"""The Sampler: owns every per-row sampling state of the executor and samples a step's rows.

What it owns, by persistent row: the requests' sampling parameters and logits processors'
state (rows.py), their grammars (grammar.py: structured outputs), the rows' last sampled tokens
on the device (the next decode inputs, read by
the model's forward and the graphs; written here and, for verify rows, by the verify scan),
and per step: its static inputs (inputs.py), its captured graphs (graphs.py, CUDA decode
steps) and the pinned host buffers the sampled ids are copied into. The runner tells it which
rows sample (prepare), hands it the logits (sample) and reads the ids after the step's event.

Randomness: Gumbel-max over a counter-based hash of (seed, position, token) (ops.py), so a
step replays identically and can live inside a CUDA graph.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from executor_svc.sample.grammar import GrammarRows
from executor_svc.sample.graphs import SamplerGraphs
from executor_svc.sample.inputs import SampleInputs, SampleStep
from executor_svc.sample.logits_processors import apply_processors, compute_logprobs, count_tokens
from executor_svc.sample.logprobs import PendingLogprobs, PromptLogprobRows, prompt_logprob_rows
from executor_svc.sample.ops import SamplingTensors, sample
from executor_svc.sample.rows import SamplingRows
from executor_svc.worker.host_device import HOST_SETS, to_device, to_host
from kernels.reference import bitmask_allows
from step_protocol.domain import NewRequestData


@dataclass
class Sampled:
    """One step's samples on their way to the host: read `host` after the step's event."""

    host: torch.Tensor  # [N] int64 view of a pinned host buffer (CUDA)
    logprobs: PendingLogprobs | None


@dataclass
class _Unconsumed:
    """Tokens sampled by constrained rows that their matchers have not consumed yet."""

    rows: np.ndarray  # [M] persistent rows
    epochs: np.ndarray  # [M] the rows' grammar epochs then (a row given to another request is passed over)
    host: torch.Tensor  # [M] their sampled ids (pinned host on CUDA)
    ready: torch.cuda.Event | None  # recorded after their copy (None on CPU: copied already)


class Sampler:
    """Samples the rows of a step. rows: their sampling state; inputs: the step's static
    columns; last_tokens: [max_num_seqs + 1] int64 device, the rows' last sampled tokens (the
    extra row is scratch for padded graph rows); graphs: the captured sampler graphs (None:
    always eager, and on CPU); grammar: the rows' grammars (None: a request with one fails)."""

    def __init__(self, rows: SamplingRows, inputs: SampleInputs, last_tokens: torch.Tensor,
                 graphs: SamplerGraphs | None = None, grammar: GrammarRows | None = None):
        self.rows, self.inputs, self.last_tokens, self.graphs = rows, inputs, last_tokens, graphs
        self.grammar = grammar
        self._unconsumed: deque[_Unconsumed] = deque()
        device = last_tokens.device
        # ids sampled by a step, copied here (pinned, one per step parity) and read after its event
        self._host = [torch.zeros(inputs.max_num_seqs, dtype=torch.int64, pin_memory=device.type == "cuda")
                      for _ in range(HOST_SETS)]
        self._parity = 0

    # ---- per request --------------------------------------------------------------------------

    def add_request(self, row: int, new: NewRequestData) -> None:
        """Sets up the sampling state of a request that was just given `row` (checked sizes)."""
        grammar = new.sampler_params.grammar
        if grammar and self.grammar is None:
            raise ValueError("this executor applies no grammars (structured outputs)")
        self.rows.add(row, new)
        if self.grammar is not None:
            self.grammar.add(row, grammar, list(new.token_ids[new.prompt_len:]))

    def remove(self, row: int) -> None:
        """Forgets a row's request: it asks for nothing until the next add_request (whose
        writes cover every field; a stale bias / stop table is reset there)."""
        r = self.rows
        r.logprobs[row] = r.prompt_logprobs[row] = -1
        r.uses_grammar[row] = False
        if self.grammar is not None:
            self.grammar.remove(row)

    def reset(self) -> None:
        """Every row forgotten (the runner's reset)."""
        for row in range(self.inputs.max_num_seqs):
            self.remove(row)
        self._unconsumed.clear()

    def take_failures(self, req_of_row) -> list[tuple[int, str]]:
        """(req_id, why) of the requests whose grammar failed since the last call (their row
        samples only EOS until it is forgotten). req_of_row(row) -> req_id or None."""
        return self.grammar.take_failures(req_of_row) if self.grammar is not None else []

    # ---- per step ---------------------------------------------------------------------------

    def prepare(self, rows: np.ndarray, positions: np.ndarray, parity: int, key: int | None = None) -> SampleStep:
        """Writes the columns of the rows that sample this step (at the positions of the tokens
        they sample) into host set `parity`; key: the steady decode step's (inputs.py: then
        only the positions move)."""
        self.inputs.use_host(parity)
        self._parity = parity
        return self.inputs.write(self.rows, rows, positions, key)

    def prompt_logprob_rows(self, requests: list, rows: np.ndarray, start: np.ndarray, end: np.ndarray,
                            offsets: np.ndarray) -> PromptLogprobRows | None:
        """The prompt positions this step's chunks compute logprobs of (sample/logprobs.py)."""
        return prompt_logprob_rows(self.rows, requests, rows, start, end, offsets)

    def pad(self, num_sample: int, to: int) -> None:
        self.inputs.pad(num_sample, to)

    def copy_to_device(self) -> None:
        self.inputs.copy_to_device()

    def sample(self, logits: torch.Tensor, step: SampleStep, graph_size: int = 0) -> Sampled:
        """Samples the step's rows: logits [N, V], row i = the i-th row prepare() was given.
        Runs the logits processors (if a row uses one), samples [N] ids, stores them as the
        rows' last tokens, counts them (if a row has penalties) and enqueues their copy (and
        their logprobs, if a row asked) to pinned host memory. graph_size: the size of the
        decode graph whose logits buffer holds row i = sampled row i (every row of the step
        samples; 0: eager, a mixed graph, or a decode step with rows that do not sample): the
        sampler's graphs of that size are replayed, the sample graph when every row samples
        plainly (no processor, no top-k / top-p), else the processors / logprobs graphs around
        the eager sampler."""
        n = step.num_sample
        graphs = self.graphs if graph_size else None
        tables = self.rows.tables
        rows = self.inputs.rows.gpu[:n]
        if graphs is not None and step.plain:
            sampled = graphs.sample(graph_size, n)  # the common decode step: one more replay
        else:
            masks = None
            if step.need_masks:  # after the last step's tokens are consumed (grammar.py, "When")
                self._catch_up()
                step_rows = self.inputs.rows.np[:n]
                masks = self.grammar.fill(step_rows, self.rows.uses_grammar[step_rows])
            processed = logits
            if step.need_processors and masks is not None:  # min_p must see only what the grammar
                # allows (else it may cut every allowed token): eager, over a masked copy
                allowed = logits.masked_fill(~bitmask_allows(masks, logits.shape[-1]), float("-inf"))
                processed = apply_processors(allowed, self.inputs.processor_params(n), tables)
            elif step.need_processors:
                processed = (graphs.processors(graph_size, n) if graphs is not None
                             else apply_processors(logits, self.inputs.processor_params(n), tables))
            sampled = sample(processed, self.inputs.tensors(n, step.all_greedy, step.need_top_k_top_p), masks)
            self.last_tokens.index_copy_(0, rows, sampled)
        if step.need_penalties:
            count_tokens(tables.counts, rows, sampled)
        host = self._host[self._parity][:n]
        host.copy_(sampled, non_blocking=True)
        if step.need_masks:
            self._keep_unconsumed(sampled, n)
        if step.num_logprobs < 0:
            return Sampled(host, None)
        lp = (graphs.logprobs(graph_size, sampled) if graphs is not None
              else compute_logprobs(logits, sampled, step.num_logprobs))
        return Sampled(host, PendingLogprobs(lp, step.num_logprobs))

    @staticmethod
    def greedy_only(step: SampleStep) -> bool:
        """Whether the step's samples are just the argmax of its logits rows (every row greedy,
        no processor, mask, penalty count or logprobs): then `take_argmax` may stand for sample."""
        return step.all_greedy and step.plain and not step.need_penalties and step.num_logprobs < 0

    def take_argmax(self, ids: torch.Tensor, step: SampleStep) -> Sampled:
        """What sample() does after drawing, for ids [N] = the argmax of the step's logits rows
        computed by the caller (a greedy verify step takes its drafts' and its rows' argmax in
        one launch, model_runner.py); only for a greedy_only(step) step: the same ids sample()
        would draw (its greedy rows take the lowest index of the maximum, as argmax does)."""
        n = step.num_sample
        self.last_tokens.index_copy_(0, self.inputs.rows.gpu[:n], ids)
        host = self._host[self._parity][:n]
        host.copy_(ids, non_blocking=True)
        return Sampled(host, None)

    def _keep_unconsumed(self, sampled: torch.Tensor, n: int) -> None:
        """Keeps the constrained rows' tokens of this step (their own pinned copy: the step's
        host buffer is reused two steps later) for the next masked step's catch-up."""
        rows = self.inputs.rows.np[:n]
        index = np.flatnonzero(self.rows.uses_grammar[rows])
        host = to_host(sampled[to_device(index, sampled.device)])
        ready = None
        if sampled.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        self._unconsumed.append(_Unconsumed(rows[index].copy(), self.grammar.epoch[rows[index]].copy(), host, ready))

    def _catch_up(self) -> None:
        """Advances the matchers over every constrained token sampled by earlier steps, in
        launch order (waits for those steps' copies: the forward of this step is enqueued)."""
        while self._unconsumed:
            u = self._unconsumed.popleft()
            if u.ready is not None:
                u.ready.synchronize()
            same = self.grammar.epoch[u.rows] == u.epochs
            tokens = [t for t, keep in zip(u.host.tolist(), same.tolist()) if keep]
            self.grammar.catch_up(u.rows[same], tokens)

    def params_of(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """Host (temperature, top_k, top_p, seed) of `rows`."""
        r = self.rows
        return r.temperature[rows], r.top_k[rows], r.top_p[rows], r.seed[rows]

