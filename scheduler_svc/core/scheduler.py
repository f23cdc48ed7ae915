"""Continuous batching by one rule: every step, hand out a token budget so that each request's
computed tokens catch up with the tokens it has. Prefill, chunked prefill, decode and resumed
requests are all that rule. See docs/scheduler.md."""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from step_protocol.domain import StepPlan

from .core_config import SchedulerCoreConfig  # noqa: F401  (re-exported: the core's config)
from .detokenizer import detokenizer_factory as make_detokenizer_factory
from .kv_cache_manager import KVCacheManager, check_runnable
from .deferred_text import DeferredText
from .logprobs import StepResultError  # noqa: F401  (re-exported: the step loop's)
from .request import FinishReason, Request, RequestStatus
from .samples import HeldSamples
from .spec.decoder import SpecDecoder
from .spec.gate import SpecSteps
from .step_results import StepResults
from .stop import StopStringMatcher
from .tokenizer import Tokenizer


class Scheduler(StepResults):
    """Plans steps (schedule) and applies their sampled tokens (update_from_output, in
    step_results.py).

    The caller may run steps ahead: schedule() for step N+1 before update_from_output() of
    step N. Every plan with rows must be applied, in step order (a plan without rows needs no
    result). A request's blocks return to the pool only once no step in flight includes it.
    detokenizer_factory makes a request's incremental detokenizer (step(token_id) -> str); a
    Tokenizer stands for detokenizer_factory(tokenizer); None means no text, only token ids.
    clock: the speculation mode trials' (spec/trials.py)."""

    def __init__(self, config: SchedulerCoreConfig,
                 detokenizer_factory: Callable[[Request], Any] | Tokenizer | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.detokenizer_factory = (make_detokenizer_factory(detokenizer_factory)
                                    if isinstance(detokenizer_factory, Tokenizer) else detokenizer_factory)
        self.requests: dict[int, Request] = {}  # live: not finished, or with steps still in flight
        self.waiting: deque[Request] = deque()  # new and preempted (at the front)
        # Samples 1..n-1 of a request, until their leader's prompt KV is written (samples.py).
        self.held = HeldSamples(config.block_size, config.enable_prefix_caching)
        self.running: list[Request] = []  # kept in arrival order: the newest is preempted first
        self._num_arrivals = self._next_step_id = 0
        self._inflight_step_ids: deque[int] = deque()
        self._finished_req_ids: list[int] = []  # for the next plan
        self._failed: dict[int, Exception] = {}  # req_id -> what its token raised (take_failed)
        self.deferred_text = DeferredText()  # the last update's rows whose text is not yet decoded
        spec = config.speculative
        self.spec = SpecDecoder(spec, config.max_model_len, config.eos_token_ids) if spec else None
        self.spec_steps = SpecSteps.for_config(spec, self.spec, clock) if spec else None  # spec/gate.py

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queues a new request. Raises ValueError if it can never run."""
        if request.req_id in self.requests:
            raise ValueError(f"request {request.req_id} already exists")
        check_runnable(request, self.config.max_model_len, self.config.block_size, self.num_total_blocks)
        request.arrival_order, self._num_arrivals = self._num_arrivals, self._num_arrivals + 1
        if self.spec_steps is not None and not self.requests:  # idle until now: not measured
            self.spec_steps.trials.restart()
        request.status = RequestStatus.WAITING
        request.stop_matcher = StopStringMatcher(request.params.stop, request.params.include_stop_str_in_output)
        request.set_token_rules(self.config.eos_token_ids, self.config.max_model_len)
        if self.detokenizer_factory is not None:
            request.detokenizer = self.detokenizer_factory(request)
        self.requests[request.req_id] = request
        if not self.held.hold(request):
            self.waiting.append(request)

    def abort_request(self, req_id: int) -> None:
        """Finishes the request as CANCELLED; no output is returned for it from now on. Unknown
        or already finished ids are ignored. Its blocks are freed once no step in flight has it."""
        request = self.requests.get(req_id)
        if request is not None and not request.is_finished:
            self._finish(request, FinishReason.CANCELLED)

    def has_work(self) -> bool:
        """Whether schedule() has something to plan (requests, or finished ids to report)."""
        return bool(self.waiting or self.running or self._finished_req_ids)

    # -- load figures --
    num_total_blocks = property(lambda self: self.kv.pool.num_total_blocks)
    num_free_blocks = property(lambda self: self.kv.pool.num_free_blocks)
    num_running = property(lambda self: len(self.running))
    num_waiting = property(lambda self: len(self.waiting) + self.held.num_held)

    def take_prefix_cache_stats(self) -> tuple[int, int]:
        """Prefix-cache (queried, hit) tokens of requests admitted since the last call."""
        return self.kv.stats.take()

    def take_spec_decode_stats(self) -> tuple[int, int, int]:
        """(verify rows, draft tokens, accepted drafts) since the last call; zeros when off."""
        return self.spec.stats.take() if self.spec is not None else (0, 0, 0)

    # -- planning ------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plans the next step: running requests first (oldest first), then waiting ones."""
        out = StepPlan(step_id=self._next_step_id, finished_req_ids=self._finished_req_ids)
        self._next_step_id, self._finished_req_ids = self._next_step_id + 1, []
        budget, can_admit = self._schedule_running(out, self.config.max_num_batched_tokens)
        if can_admit:
            self._schedule_waiting(out, budget)
        if out.has_rows():
            self._inflight_step_ids.append(out.step_id)
        return out

    def _schedule_running(self, out: StepPlan, budget: int) -> tuple[int, bool]:
        """Returns the budget left and whether waiting requests may be admitted this step.
        A row that continues within its last block costs a few integer operations here: the
        one rule (_num_new_tokens), the block check and Request.advance are inline."""
        i, spec, running, num_running = 0, self.spec_steps, self.running, len(self.running)
        cached, block_size = out.cached_requests, self.config.block_size
        req_ids, counts, num_new_blocks = cached.req_ids, cached.num_scheduled_tokens, cached.num_new_blocks
        threshold = self.config.long_prefill_token_threshold or budget  # 0 = off
        while i < len(running) and budget > 0:
            request = running[i]
            i += 1
            pending, computed = request.num_pending_tokens, request.num_computed_tokens
            num_output = len(request.output_token_ids)
            num_tokens = len(request.prompt_token_ids) + num_output + pending  # with those in flight
            speculate = spec is not None and spec.speculates(request, num_running)  # waits, then drafts
            if num_output + pending >= request.num_output_limit:
                num_new = 0  # its last token is in flight: it finishes whatever the token is
            elif speculate and pending:
                num_new = 0  # speculating: its next drafts need the tokens in flight (docs/scheduler.md)
            else:
                num_new = min(num_tokens - computed, budget, threshold)  # _num_new_tokens, inline
            drafts = None
            if speculate:  # a verify row (its token, then drafts), maybe chained on rows in flight
                num_new, drafts, chained = spec.plan_row(request, num_new, budget, num_running)
            if num_new == 0:  # finishes once its token in flight arrives (or speculates)
                continue
            if computed + num_new > len(request.block_ids) * block_size:  # needs a block
                if not self._make_room(request, num_new, out):
                    return budget, False
                cached.append(request.req_id, num_new, self.kv.allocate_slots(request, num_new))
            else:  # most decode steps: the slot is in the last block, nothing to allocate
                req_ids.append(request.req_id)
                counts.append(num_new)
                num_new_blocks.append(0)
            if drafts:
                out.add_drafts(drafts, chained)
                spec.record(request, out.step_id, drafts, chained)
            request.num_computed_tokens = computed = computed + num_new  # Request.advance, inline
            request.num_inflight_steps += 1
            if computed >= num_tokens:
                request.num_pending_tokens = pending + 1  # the row reaches the end of its tokens
            budget -= num_new
        return budget, not out.preempted_req_ids

    def _make_room(self, request: Request, num_new_tokens: int, out: StepPlan) -> bool:
        """Preempts the newest running requests until request's new slots fit in the pool.
        Blocks of preempted or finished requests still in a step in flight come back only after
        that step is applied: if those suffice, preempt no more and wait a step. Returns False
        when request cannot run this step (waiting, or itself preempted)."""
        while not self.kv.can_allocate_slots(request, num_new_tokens):
            num_needed = self.kv.num_blocks_needed(request, num_new_tokens)
            if self.num_free_blocks + self.kv.num_blocks_freeing(self.running) >= num_needed:
                return False
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, out: StepPlan, budget: int) -> None:
        """Admits waiting requests in order (FCFS) while budget, seats and blocks last."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.num_inflight_steps > 0:
                break  # preempted with a token in flight: its ids are not all known yet
            # A cached prefix is not computed again; prompt logprobs need the prompt's logits.
            skip_cache = request.wants_prompt_logprobs
            hits = [] if skip_cache else self.kv.get_computed_blocks(request)
            num_computed = len(hits) * self.config.block_size
            num_new_tokens = self._num_new_tokens(request, budget, num_computed)
            if not self.kv.can_allocate_slots(request, num_new_tokens, hits):
                break
            self.waiting.popleft()
            self.kv.allocate_slots(request, num_new_tokens, hits)
            if not skip_cache:
                self.kv.record_admission(request, num_computed)
            request.num_computed_tokens = num_computed
            out.new_requests.append(request.new_request_data(num_new_tokens, self.config.eos_token_ids))
            request.status = RequestStatus.RUNNING
            bisect.insort(self.running, request, key=lambda r: r.arrival_order)
            request.advance(num_new_tokens)
            budget -= num_new_tokens
            self.held.release(request, self.waiting)  # its prefix hit may cover its prompt

    def _num_new_tokens(self, request: Request, budget: int, num_computed: int) -> int:
        """The one rule: catch computed tokens up with all tokens, within the limits (for a
        running request inline in _schedule_running, which adds speculation's rule)."""
        pending, num_output = request.num_pending_tokens, len(request.output_token_ids)
        num_tokens = len(request.prompt_token_ids) + num_output + pending  # with those in flight
        if num_output + pending >= request.params.max_tokens or num_tokens >= self.config.max_model_len:
            return 0  # its last token is in flight: it will finish whatever the token is (length_reached)
        threshold = self.config.long_prefill_token_threshold  # 0 = off
        return min(num_tokens - num_computed, budget, threshold if threshold > 0 else budget)

    def _preempt(self, request: Request, out: StepPlan) -> None:
        """Recompute later: drop its KV, keep its tokens, put it at the front of the queue."""
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self._release_blocks(request)
        self.waiting.appendleft(request)
        out.preempted_req_ids.append(request.req_id)
        self.held.release(request, self.waiting)  # its samples wait no more

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
            self._finished_req_ids.append(request.req_id)  # the executor holds its row
        elif not self.held.remove(request):
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self._release_blocks(request)
        self.held.release(request, self.waiting)  # its samples wait no more

    def _release_blocks(self, request: Request) -> None:
        """Frees a finished or preempted request's blocks once no step in flight has it."""
        if request.num_inflight_steps > 0 or request.status in (
                RequestStatus.RUNNING, RequestStatus.WAITING):
            return
        if request.block_ids:
            self.kv.free(request)
        if request.is_finished:
            self.requests.pop(request.req_id, None)
            request.detokenizer = None
