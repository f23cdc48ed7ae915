"""ModelRunner: runs one step plan on the device — update rows, prepare inputs, forward, sample.

A step is launched (enqueued on the device, no host sync) and finished later (wait for its
event, read the sampled ids), so the next step can be launched while this one runs. The runner
is built, with everything it needs, by startup.build_runner."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.kv_cache import KVCache
from executor_svc.models.llama import LlamaForCausalLM
from executor_svc.sample.graphs import SamplerGraphs, processor_params, sampling_params
from executor_svc.sample.logits_processors import apply_processors, compute_logprobs, count_tokens
from executor_svc.sample.logprobs import PendingLogprobs, PendingPromptLogprobs, prompt_logprobs
from executor_svc.sample.sampler import sample
from executor_svc.spec_decode.draft import DraftProposer
from executor_svc.spec_decode.verify import Rollbacks, VerifyRows, prepare_verify, verify, verify_result
from executor_svc.worker.cuda_graphs import GraphRunner, GraphShape
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_apply import Admitted, admit
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import PreparedStep, Scheduled, StepLimits, prepare_step
from executor_svc.worker.step_timer import StepTimer
from step_protocol.domain import ExecutorInfo, StepPlan, StepResult


@dataclass
class StepHandle:
    """A launched step: what finish() needs to turn it into its StepResult."""

    out: StepResult  # step_id, prepare_us, graph_size set by launch(); the rest by finish()
    req_ids: list[int] = field(default_factory=list)  # requests that sample, in plan order
    sampled_host: torch.Tensor | None = None  # [N] int64 view of a pinned host buffer
    timer: StepTimer | None = None  # CUDA: its last event marks the step's completion
    prev_end: torch.cuda.Event | None = None  # the previous step's completion (device idle)
    logprobs: PendingLogprobs | None = None
    prompt_logprobs: PendingPromptLogprobs | None = None
    verify: VerifyRows | None = None  # speculative decoding's verify rows (spec_decode/verify.py)
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def step_id(self) -> int:
        return self.out.step_id


class ModelRunner:
    """Launches and finishes the steps of one device over what start-up built: the model, its
    KV caches, the persistent request rows (batch), the static step buffers and, on CUDA, the
    captured decode graphs (None = always eager) with their processor/logprobs graphs.
    `info` is the handshake answer. drafter: speculative decoding's draft model (spec_decode/draft.py;
    start-up sets it), None without one."""

    drafter: DraftProposer | None = None

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], batch: InputBatch,
                 buffers: StepBuffers, limits: StepLimits, info: ExecutorInfo,
                 graphs: GraphRunner | None = None, sampler_graphs: SamplerGraphs | None = None):
        self.model, self.kv_caches, self.batch, self.buffers = model, kv_caches, batch, buffers
        self.limits, self._info, self.graphs = limits, info, graphs
        self.sampler_graphs = sampler_graphs
        self.device = buffers.device
        self._graphs_on = graphs is not None
        # ids sampled by a step, copied here (pinned, one per step parity) and read in finish()
        self._sampled_host = [torch.zeros(limits.max_num_seqs, dtype=torch.int64,
                                          pin_memory=self.device.type == "cuda") for _ in range(2)]
        self._parity = 0  # host buffer set of the next launched step
        self._handles: list[StepHandle | None] = [None, None]  # last launched step of each parity
        self._last_end: torch.cuda.Event | None = None  # completion event of the last launched step
        self._stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None  # every step's
        self._rollbacks = Rollbacks()  # rejected drafts' slots, given back at the next launch

    def info(self) -> ExecutorInfo:
        """The handshake answer: what start-up loaded, allocated and captured."""
        return self._info

    def use_graphs(self, enabled: bool) -> None:
        """Replays captured graphs for the steps launched from now on (the default when graphs
        were captured), or runs every step eagerly; benchmarks and tests compare the two."""
        self._graphs_on = enabled and self.graphs is not None

    def reset(self) -> None:
        """Finishes any launched step, then forgets every request."""
        for handle in self._handles:
            if handle is not None:
                self.finish(handle)
        self._handles = [None, None]
        self._last_end = None
        self._rollbacks.clear()
        self.batch.clear()

    # ---- one step -------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepResult:
        """Runs one step plan; returns the sampled token of each request that completed its known tokens."""
        return self.finish(self.launch(plan))

    @torch.inference_mode()
    def launch(self, plan: StepPlan, arrived: float | None = None) -> StepHandle:
        """Enqueues one step on the device and returns without waiting for it.

        Checks the plan (a bad one raises PlanError and changes nothing; a bad row fails
        alone, in the result's failed_req_ids, and the rest runs), updates rows,
        prepares the inputs in host set (step parity), copies them non-blocking, runs the
        forward (graph replay or eager), samples on the device, stores the ids as the rows'
        last tokens, enqueues their copy into a pinned host buffer and records an event.
        No host synchronisation, except when the step that last used this parity's buffers has
        not been finished yet (more than two steps outstanding): then it is finished first.
        Steps must be finished in launch order; finish() may run on another thread.
        arrived: time.perf_counter() when the plan arrived (its wait is reported as queued_us).
        """
        t0 = time.perf_counter()
        out = StepResult(step_id=plan.step_id)
        if arrived is not None:
            out.queued_us = int((t0 - arrived) * 1e6)
        admitted = self._update_states(plan)
        plan, scheduled = admitted.plan, admitted.scheduled  # the plan less its failed rows
        if admitted.failed:
            out.failed_req_ids = [req_id for req_id, _ in admitted.failed]
            out.failed_errors = [why for _, why in admitted.failed]
        if not scheduled:
            return StepHandle(out, finished=True)
        parity = self._parity
        self._parity ^= 1
        prev = self._handles[parity]
        if prev is not None:
            self.finish(prev)  # normally done already: its buffers are free
        try:
            self.buffers.use_host(parity)
            step = self._prepare(scheduled)
            spec = None if scheduled.drafts is None else prepare_verify(
                self.batch, self.buffers, scheduled, plan.draft_token_ids, step.sample_rows)
            shape = self.graphs.shape_for(step, spec is not None) if self._graphs_on else None
            timer = StepTimer(self.device, self._stream)
            timer.mark()  # the step's start on the device: before its input copies
            attn = self._copy_inputs(step, shape)
            out.prepare_us = int((time.perf_counter() - t0) * 1e6)
            out.graph_size = shape.num_tokens if shape is not None else 0  # decode: = its batch
            timer.mark()
            if self.drafter is not None:  # draft model: its KV catches up, verify rows get drafts
                self.drafter.propose(scheduled, spec, parity, self.buffers.input_ids.gpu)
            logits, hidden = self._forward(step, attn, shape)  # [N, V]; [T, H] when eager
            timer.mark()
            sampled_host = self._sampled_host[parity][:step.num_sample]
            handle = StepHandle(out, [], sampled_host, timer, prev_end=self._last_end)
            if spec is not None and spec.chained is not None:  # last tokens before the sampler's (void rows)
                spec.prev_last = self.batch.last_sampled_gpu[spec.rows]
            if step.num_sample:
                decode_size = shape.num_reqs if shape is not None and shape.decode else 0
                handle.logprobs = self._sample(step, logits, sampled_host, decode_size)
            if spec is not None:  # verify steps: eager, or a mixed graph (its hidden states)
                handle.verify = self._verify(spec, hidden)
            if step.prompt_logprobs is not None:
                handle.prompt_logprobs = prompt_logprobs(self.model.compute_logits, hidden,
                                                         step.prompt_logprobs)
            timer.mark()  # after the copies to the host: the step's completion event
        except BaseException:
            if self._stream is not None:  # copies out of this host set may still be pending
                self._stream.synchronize()
            raise
        by_row = self.batch.states
        handle.req_ids = [by_row[r].req_id for r in step.sample_rows.tolist()]
        self._handles[parity] = handle
        self._last_end = timer.end_event
        out.launch_us = int((time.perf_counter() - t0) * 1e6)
        return handle

    def finish(self, handle: StepHandle) -> StepResult:
        """Waits for a launched step, reads its sampled ids and fills the timings. Idempotent;
        thread-safe against launch() of the next step."""
        with handle.lock:
            if handle.finished:
                return handle.out
            out, timer = handle.out, handle.timer
            timer.wait()  # CUDA: event.synchronize() (releases the GIL)
            out.forward_us, out.sample_us = timer.elapsed_us()
            out.device_idle_us = timer.idle_before_us(handle.prev_end)
            handle.prev_end = None  # keep no chain of events alive
            if handle.req_ids:
                out.token_ids = handle.sampled_host.tolist()
                out.req_ids = handle.req_ids
                if handle.logprobs is not None:
                    out.logprobs = handle.logprobs.result(out.token_ids)
                if handle.verify is not None:  # a verify row answers its accepted drafts + 1
                    out.token_ids, out.num_tokens = verify_result(handle.verify, out.token_ids, self._rollbacks)
            if handle.prompt_logprobs is not None:
                out.prompt_logprobs = handle.prompt_logprobs.result()
            handle.finished = True
            return out

    def _update_states(self, plan: StepPlan) -> Admitted:
        """Gives back rejected drafts' slots, then checks and applies the plan (plan_apply.py:
        PlanError and nothing changed, or the rows that fail alone dropped)."""
        self._apply_rollbacks()  # of verify steps finished since the last launch
        return admit(plan, self.batch, self._info)

    def _apply_rollbacks(self) -> None:
        self._rollbacks.apply(self.batch)

    def _verify(self, spec: VerifyRows, hidden: torch.Tensor) -> VerifyRows | None:
        """Scores the drafts and picks the verify rows' tokens (spec_verify.verify); returns what
        finish() reads (None: nothing to answer or roll back)."""
        verify(spec, self.model.compute_logits(hidden[spec.token_index]), self.batch.last_sampled_gpu,
               self.batch.chain_ok_gpu)
        return spec

    def _prepare(self, scheduled: Scheduled) -> PreparedStep:
        """Writes the step's inputs into the host buffers, advances the rows (step_inputs.py)."""
        return prepare_step(self.batch, self.buffers, scheduled, self.limits)

    def _copy_inputs(self, step: PreparedStep, shape: GraphShape | None) -> AttentionMetadata:
        """Copies the first rows of every buffer to the device (padded to the graph's shape)."""
        buf = self.buffers
        if shape is not None:
            buf.pad(step.num_reqs, step.num_tokens, step.num_sample, shape.num_reqs, shape.num_tokens)
            num_reqs, num_tokens = shape.num_reqs, shape.num_tokens
        else:
            num_reqs, num_tokens = step.num_reqs, step.num_tokens
        buf.copy_to_device(num_reqs, num_tokens)
        return AttentionMetadata.from_buffers(buf, num_reqs, num_tokens, step.max_query_len,
                                              step.max_seq_len, num_sample=step.num_sample)

    def _forward(self, step: PreparedStep, attn: AttentionMetadata,
                 shape: GraphShape | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([N, V] logits of the sampled rows, [T, H] hidden states or None): the graph of
        `shape` replayed (a mixed graph's hidden states, none of a decode graph), or eagerly
        (shape None)."""
        if shape is not None:
            logits = self.graphs.replay(shape)  # [B, V] model dtype: the sampler reads it once
            if shape.decode and step.num_sample == step.num_reqs:  # every row samples: row i
                return logits[:step.num_sample], None
            if shape.decode:  # row i = request i; some rows (1-token prefill chunks) do not sample
                return logits[attn.logits_indices], None
            # row i = token logits_indices[i]
            return logits[:step.num_sample], self.graphs.hidden[:step.num_tokens]
        t = step.num_tokens
        tokens = self.buffers.input_tokens(self.batch.last_sampled_gpu, t)  # [T] int64
        hidden = self.model(tokens, self.buffers.positions.gpu[:t], attn, self.kv_caches)  # [T, H]
        return self.model.compute_logits(hidden[attn.logits_indices]), hidden

    def _sample(self, step: PreparedStep, logits: torch.Tensor, sampled_host: torch.Tensor,
                graph_size: int) -> PendingLogprobs | None:
        """Runs the logits processors (if a row uses one), samples [N] ids, stores them as the
        rows' last tokens on the device, counts them (if a row has penalties) and enqueues
        their copy (and their logprobs, if a row asked) to pinned host memory; finish() reads
        them after the event. Steps that replayed a decode graph of graph_size (0: eager or a
        mixed graph) replay the captured sampler graphs of that size too: the sample graph when
        every row samples without processors or top-k/top-p, else processors/logprobs graphs."""
        buf, n = self.buffers, step.num_sample
        graphs = self.sampler_graphs if graph_size else None
        tables = self.batch.sampling.tables
        rows = buf.sample_rows.gpu[:n]
        if graphs is not None and n == step.num_reqs and not (step.need_processors or step.need_top_k_top_p):
            sampled = graphs.sample(graph_size, n)  # the common decode step: one more replay
        else:
            processed = logits
            if step.need_processors:
                processed = (graphs.processors(graph_size, n) if graphs is not None
                             else apply_processors(logits, processor_params(buf, n), tables))
            params = sampling_params(buf, n, step.all_greedy, step.need_top_k_top_p)
            sampled = sample(processed, params)  # [N] int64
            self.batch.last_sampled_gpu.index_copy_(0, rows, sampled)
        if step.need_penalties:
            count_tokens(tables.counts, rows, sampled)
        sampled_host.copy_(sampled, non_blocking=True)
        if step.num_logprobs < 0:
            return None
        lp = (graphs.logprobs(graph_size, sampled) if graphs is not None
              else compute_logprobs(logits, sampled, step.num_logprobs))
        return PendingLogprobs(lp, step.num_logprobs)
