"""ModelRunner: runs one step plan on the device — update rows, prepare inputs, forward, sample.

A step is launched (enqueued on the device, no host sync) and finished later (wait for its
event, read the sampled ids), so the next step can be launched while this one runs. The runner
is built, with everything it needs, by startup.build_runner: the rows (InputBatch), the step
buffers, the Sampler (sample/: every per-row sampling state), the Verifier and the draft
proposer (spec_decode/), the graphs, and the ranks it runs with (worker/ranks.py: one device,
or tensor parallelism's TensorParallelRanks, called at fixed points of a step)."""

from __future__ import annotations

import time

import torch

from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.kv_cache import KVCache
from executor_svc.models.llama import LlamaForCausalLM
from executor_svc.sample.logprobs import prompt_logprobs
from executor_svc.sample.sampler import Sampler
from executor_svc.spec_decode.draft import DraftProposer
from executor_svc.spec_decode.verify import Verifier
from executor_svc.spec_decode.verify_tail import tail_kind
from executor_svc.worker.cuda_graphs import GraphRunner, GraphShape
from executor_svc.worker.deferred_sampling import DeferredSampling
from executor_svc.worker.host_device import HOST_SETS
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_apply import Admitted, admit
from executor_svc.worker.ranks import OneDevice
from executor_svc.worker.steady import SteadyDecode
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_handle import Prepared, StepHandle
from executor_svc.worker.step_inputs import PreparedStep, StepLimits, prepare_step, use_token_rows
from executor_svc.worker.step_timer import EventPool, StepTimer
from step_protocol.domain import ExecutorInfo, StepPlan, StepResult


class ModelRunner:
    """Launches and finishes the steps of one device over what start-up built: the model, its
    KV caches, the persistent request rows (batch), the static step buffers, the sampler and,
    on CUDA, the captured graphs (None = always eager). `info` is the handshake answer.
    drafter: speculative decoding's draft model (spec_decode/draft.py), None without one;
    ranks: the other devices of each step (worker/ranks.py)."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], batch: InputBatch,
                 buffers: StepBuffers, sampler: Sampler, limits: StepLimits, info: ExecutorInfo,
                 graphs: GraphRunner | None = None, drafter: DraftProposer | None = None, ranks=None):
        self.model, self.kv_caches, self.batch, self.buffers = model, kv_caches, batch, buffers
        self.sampler, self.limits, self._info, self.graphs = sampler, limits, info, graphs
        self.drafter, self.ranks = drafter, ranks if ranks is not None else OneDevice()
        self.device = buffers.device
        self.verifier = Verifier(limits.max_num_seqs, limits.max_num_tokens, buffers, sampler, graphs)
        self._graphs_on = graphs is not None
        self._parity = 0  # host buffer set of the next launched step
        self._handles: list[StepHandle | None] = [None] * HOST_SETS  # last launched step of each parity
        self._last_timer: StepTimer | None = None  # of the last launched step (its last mark: its completion)
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.current_stream(self.device) if cuda else None  # every step's
        self._events = EventPool() if cuda else None  # every step's marks
        self._deferred = DeferredSampling(sampler, self._take_failures)  # constrained steps'
        self._steady = SteadyDecode(self.ranks.alone, limits.max_num_seqs, self.device)  # the last step's rows again

    def info(self) -> ExecutorInfo:  # the handshake answer: what start-up loaded, allocated and captured
        return self._info

    def use_graphs(self, enabled: bool) -> None:
        """Replays captured graphs (the default when captured) for the steps launched from now on, or not."""
        with self.ranks.guard():
            self.ranks.use_graphs(enabled)
        self._graphs_on = enabled and self.graphs is not None
        self._steady.forget()  # (its steps' layout was the other mode's)

    def reset(self) -> None:
        """Finishes any launched step, then forgets every request."""
        with self.ranks.guard():
            self.ranks.reset()
            for handle in self._handles:
                if handle is not None:
                    self.finish(handle)
            self._handles = [None] * HOST_SETS
            self._last_timer = None
            self._deferred.clear()
            self._steady.forget()
            self.verifier.rollbacks.clear()
            self.batch.clear()
            self.sampler.reset()

    def watch(self, on_failure) -> None:  # on_failure(reason), once, when another rank dies
        self.ranks.watch(on_failure)

    def close(self, timeout: float = 10.0) -> None:  # stops the other ranks, if any
        self.ranks.close(timeout)

    def execute(self, plan: StepPlan) -> StepResult:  # the sampled tokens of the requests that completed their known tokens
        return self.finish(self.launch(plan))

    @torch.inference_mode()
    def launch(self, plan: StepPlan, arrived: float | None = None) -> StepHandle:
        """Enqueues one step on the device and returns without waiting for it.

        Checks the plan (a bad one raises PlanError and changes nothing; a bad row fails
        alone, in the result's failed_req_ids), updates rows, prepares the inputs in host set
        (step parity), copies them non-blocking, runs the forward (graph replay or eager),
        samples on the device (into pinned host memory), verifies the drafts of verify rows
        and records an event. No host synchronisation, except when the step that last used
        this parity's buffers has not been finished yet: then it is finished first. Steps
        must be finished in launch order; finish() may run on another thread. arrived:
        time.perf_counter() when the plan arrived (queued_us); launch_us and launch_cpu_us
        are the launch's wall and thread CPU time."""
        t0, cpu0 = time.perf_counter(), time.thread_time_ns()
        with self.ranks.guard(), self._deferred.lock:
            self._deferred.flush()  # the previous step's masked sampling: before this plan changes any row
            handle = self._launch(plan, arrived, t0)
        if not handle.finished:  # (a step with no row left ran nothing)
            handle.out.launch_cpu_us = (time.thread_time_ns() - cpu0) // 1000
            handle.out.launch_us = int((time.perf_counter() - t0) * 1e6)
        return handle

    def _launch(self, plan: StepPlan, arrived: float | None, t0: float) -> StepHandle:
        out = StepResult(step_id=plan.step_id)
        if arrived is not None:
            out.queued_us = int((t0 - arrived) * 1e6)
        admitted = self.ranks.admit(plan, self.verifier.rollbacks.take(self.batch), self._apply)
        plan, scheduled = admitted.plan, admitted.scheduled  # the plan less its failed rows
        if admitted.failed:
            out.failed_req_ids = [req_id for req_id, _ in admitted.failed]
            out.failed_errors = [why for _, why in admitted.failed]
        if not scheduled:
            return StepHandle(out, finished=True)
        parity = self._parity
        self._parity = (parity + 1) % HOST_SETS
        prev = self._handles[parity]
        if prev is not None:
            self.finish(prev)  # normally done already: its buffers are free
        try:
            step, sampling, prompt_rows, spec = self._prepare(admitted, parity)
            num_logits = step.num_sample + (spec.num_draft_logits if spec is not None else 0)
            need_hidden = (spec is not None and spec.logits_row is None) or prompt_rows is not None
            shape = self.graphs.shape_for(step, need_hidden) if self._graphs_on else None
            timer = StepTimer(self._events, self._stream)
            timer.mark()  # the step's start on the device: before its input copies
            attn = self._copy_inputs(step, shape, num_logits, parity)
            out.prepare_us = int((time.perf_counter() - t0) * 1e6)
            out.graph_size = shape.num_tokens if shape is not None else 0  # decode: = its batch
            timer.mark()
            drafts = None if spec is None else spec.draft_ids
            if self.drafter is not None:  # draft model: its KV catches up, verify rows get drafts
                drafts = self.drafter.propose(scheduled, spec, parity, self.buffers.input_ids.gpu)
            tail = spec is not None and spec.tail is not None  # token rows sampling plainly: verify_tail.py
            logits, hidden = self._forward(step, attn, shape, num_logits, tail)  # [N + D, V]; [T, H] eager
            timer.mark()
            before = self._last_timer  # its last mark is final: a deferred sampling was flushed above
            handle = StepHandle(out, timer=timer, prev_end=before.end_event if before is not None else None)
            last = self.sampler.last_tokens
            prev_last = last[spec.rows] if spec is not None and spec.chained is not None else None
            greedy = None  # a greedy verify step's argmax of its drafts' logits rows
            if tail and self.ranks.decides:  # the rows' tokens and the drafts' scan: one pass
                graph_size = shape.num_reqs if shape is not None and shape.decode else 0  # (its tail's graph)
                handle.sampled, handle.verify = self.verifier.run_tail(spec, logits, step.num_tokens, graph_size)
            elif step.num_sample and self.ranks.decides:
                every_row = shape is not None and shape.decode and step.num_sample == step.num_reqs
                graph_size = shape.num_reqs if every_row else 0
                if sampling.need_masks and spec is None and self.ranks.alone:
                    self._deferred.defer(handle, logits, sampling, graph_size)  # its masks need N-1's tokens
                elif spec is not None and spec.logits_row == step.num_sample and spec.params.all_greedy \
                        and self.sampler.greedy_only(sampling):  # one argmax: the rows' samples, then the drafts'
                    ids = logits[:num_logits].argmax(dim=-1)
                    handle.sampled = self.sampler.take_argmax(ids[:step.num_sample], sampling)
                    greedy = ids[step.num_sample:]
                else:
                    handle.sampled = self.sampler.sample(logits[:step.num_sample], sampling, graph_size)
            if spec is not None and not tail:  # the drafts' logits rows follow the sampled rows' (or hidden)
                draft_logits = (logits[spec.logits_row:num_logits] if spec.logits_row is not None  # every rank
                                else self.model.compute_logits(hidden[spec.token_index]))
                if self.ranks.decides:  # (the verify writes the rows' last tokens: the final ones)
                    handle.verify = (spec, self.verifier.verify(spec, draft_logits, drafts, last, prev_last, greedy))
            if step.num_sample and handle.deferred is None:
                self.ranks.share_last_tokens(last)  # the deciding rank's, once final
            if prompt_rows is not None:
                handle.prompt_logprobs = prompt_logprobs(self.model.compute_logits, hidden, prompt_rows)
            self._take_failures(out)
            if handle.deferred is None:
                timer.mark()  # after the copies to the host: the step's completion event
        except BaseException:
            self._deferred.clear()  # a step that failed in its launch is never sampled later
            self._steady.forget()
            if self._stream is not None:  # copies out of this host set may still be pending
                self._stream.synchronize()
            raise
        by_row = self.batch.states  # (a steady step's rows sample in plan order: its ids)
        handle.req_ids = (list(plan.cached_requests.req_ids) if admitted.steady is not None
                          else [by_row[r].req_id for r in step.sample_rows.tolist()])
        self._handles[parity] = handle
        self._last_timer = timer
        return handle

    def finish(self, handle: StepHandle) -> StepResult:
        """Waits for a launched step, reads its sampled ids and fills the timings. Idempotent;
        thread-safe against launch() of the next step."""
        if handle.flushed is not None:
            self._deferred.wait(handle)
        with handle.lock:
            if handle.finished:
                return handle.out
            out, timer = handle.out, handle.timer
            timer.wait()  # CUDA: event.synchronize() (releases the GIL)
            out.forward_us, out.sample_us = timer.elapsed_us()
            out.device_idle_us = timer.idle_before_us(handle.prev_end)
            handle.prev_end = None  # keep no chain of events alive
            sampled = handle.sampled
            if handle.req_ids and sampled is not None:
                out.token_ids = sampled.host.tolist()
                out.req_ids = handle.req_ids
                if sampled.logprobs is not None:
                    out.logprobs = sampled.logprobs.result(out.token_ids)
                if handle.verify is not None:  # a verify row answers its accepted drafts + 1
                    out.token_ids, out.num_tokens = self.verifier.result(*handle.verify, out.token_ids)
            if handle.prompt_logprobs is not None:
                out.prompt_logprobs = handle.prompt_logprobs.result()
            handle.finished = True
            return out

    def _take_failures(self, out: StepResult) -> None:
        failed = self.sampler.take_failures(self.batch.req_of_row)  # their grammar failed
        out.failed_req_ids += [req_id for req_id, _ in failed]
        out.failed_errors += [why for _, why in failed]

    def _apply(self, plan: StepPlan, give_back: list[tuple[int, int]]) -> Admitted:
        """Gives back rejected drafts' slots, then checks and applies the plan (plan_apply.py:
        PlanError and nothing changed, or the rows that fail alone dropped)."""
        self.batch.give_back(give_back)
        steady = None if give_back else self._steady.admit(plan, self.batch, self.sampler, self._info)
        return steady or admit(plan, self.batch, self.sampler, self._info)

    def _prepare(self, admitted: Admitted, parity: int) -> Prepared:
        """Writes the step's inputs into host set `parity`: the rows' chunks (step_inputs.py,
        which advances the rows), the sampled rows' columns (the Sampler's), the prompt
        positions with logprobs and the verify rows' drafts."""
        scheduled = admitted.scheduled
        token_rows = admitted.steady is None and use_token_rows(scheduled, self._token_rows_max())
        self.buffers.use_host(parity)
        if admitted.steady is not None:  # the last step's rows again: only what moves
            step = self._steady.prepare(self.batch, self.buffers, admitted, self.limits.block_size,
                                        on_device=self.buffers.packed.packs)
        else:
            step = prepare_step(self.batch, self.buffers, scheduled, self.limits, token_rows)
            self._steady.remember(admitted.plan, step, scheduled, self.batch)
        sampling = self.sampler.prepare(step.sample_rows, step.sample_positions, parity, self._steady.key)
        prompt_rows = None if admitted.steady is not None else self.sampler.prompt_logprob_rows(  # (decode rows: none)
            self.batch.states, scheduled.rows, step.chunk_start, step.chunk_start + scheduled.counts,
            step.token_offset)
        spec = None if scheduled.drafts is None else self.verifier.prepare(  # (drafts: never a steady step)
            self.batch, self.sampler, self.buffers, scheduled, admitted.plan.draft_token_ids, step.sample_rows, parity,
            tail=tail_kind(sampling) if token_rows else None)
        return Prepared(step, sampling, prompt_rows, spec)

    def _token_rows_max(self) -> int:
        """The most tokens a verify step lays out as token rows (step_inputs.py): the largest
        decode graph's, or any the buffers hold when it runs eagerly."""
        return self.graphs.sizes[-1] if self._graphs_on and self.graphs.sizes else self.limits.max_num_seqs

    def _copy_inputs(self, step: PreparedStep, shape: GraphShape | None, num_logits: int,
                     parity: int) -> AttentionMetadata:
        """Copies the first rows of every buffer to the device (padded to the graph's shape), or
        moves a steady step's inputs on the device (steady.py) when the device holds the last
        step's in this step's layout; num_logits: the sampled rows' and any drafts' logits rows."""
        buf = self.buffers
        num_reqs, num_tokens = (shape.num_reqs, shape.num_tokens) if shape is not None else (step.num_reqs,
                                                                                              step.num_tokens)
        if step.advance is not None and buf.packed.last == (num_reqs, num_tokens):
            self._steady.advance(buf, step, self.sampler.inputs.device_positions(), self.limits.block_size, parity)
        else:
            if step.advance is not None:  # (not the last step's layout: copied after all)
                self._steady.write_host(self.batch, buf, step, self.limits.block_size)
            if shape is not None:
                buf.pad(step.num_reqs, step.num_tokens, num_logits, shape.num_reqs, shape.num_tokens)
                self.sampler.pad(step.num_sample, shape.num_reqs)
            buf.copy_to_device(num_reqs, num_tokens)
            self.sampler.copy_to_device()
        return AttentionMetadata.from_buffers(buf, num_reqs, num_tokens, step.max_query_len,
                                              step.max_seq_len, num_sample=num_logits)

    def _forward(self, step: PreparedStep, attn: AttentionMetadata, shape: GraphShape | None,
                 num_logits: int, token_order: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """([num_logits, V] logits of the sampled rows then any drafts' rows, or of every token
        row in order (token_order: a tail's step), [T, H] hidden states or None): the
        graph of `shape` replayed (a mixed graph's hidden states, none of a decode graph), or
        eagerly (shape None)."""
        if shape is not None:
            logits = self.graphs.replay(shape)  # [B, V] model dtype: the sampler reads it once
            if shape.decode and (step.num_sample == step.num_reqs or token_order):  # row i: sampled row i, or token i
                return (logits if token_order else logits[:step.num_sample]), None
            if shape.decode:  # row i = request i; some rows (1-token prefill chunks) do not sample
                return logits[attn.logits_indices], None
            # row i = token logits_indices[i]
            return logits[:num_logits], self.graphs.hidden[:step.num_tokens]
        t = step.num_tokens
        tokens = self.buffers.input_tokens(self.sampler.last_tokens, t)  # [T] int64
        hidden = self.model(tokens, self.buffers.positions.gpu[:t], attn, self.kv_caches)  # [T, H]
        return self.model.compute_logits(hidden[attn.logits_indices]), hidden
