"""Applying a step's result: the second half of the Scheduler (core/scheduler.py), apart so
that each file stays one job. A row that simply continues (the most rows of a decode step)
costs a few integer operations and one output; its text is decoded afterwards
(deferred_text.py); only rows a rule may end, verify rows and rows with logprobs take the
general path (spec/decoder.tokens_output). See docs/scheduler.md, "The step's per-row work"."""

from __future__ import annotations

from collections import deque

from step_protocol.domain import StepPlan, StepResult

from .deferred_text import DeferredText
from .kv_cache_manager import KVCacheManager
from .logprobs import StepLogprobs, StepResultError, collect_prompt_logprobs, continuing_output
from .outputs import RequestOutput
from .request import Request, RequestStatus
from .spec.decoder import tokens_output


class StepResults:
    """update_from_output and what it needs; the Scheduler's state (set by its __init__)."""

    kv: KVCacheManager
    requests: dict[int, Request]
    waiting: deque[Request]
    _inflight_step_ids: deque[int]
    _failed: dict[int, Exception]
    deferred_text: DeferredText

    def take_failed(self) -> dict[int, Exception]:
        """Requests whose own token raised while update_from_output applied it (or fill_text
        decoded it), since the last call, with the exception: each failed alone (aborted: no
        output; its blocks go back)."""
        failed, self._failed = self._failed, {}
        return failed

    def update_from_output(self, output: StepPlan, sampled: dict[int, int],
                           result: StepResult | None = None, defer_text: bool = False) -> list[RequestOutput]:
        """Applies a step's sampled tokens (req_id -> token id, or -> token ids of a verify
        row); returns what each request produced. Tokens of requests finished or aborted
        meanwhile are discarded. sampled must hold every row that reached the end of its
        tokens (a partial prefill chunk samples nothing); if the executor failed the step,
        abort its requests first. result carries the logprobs of requests that asked.
        defer_text: the text of rows that simply continue is left to fill_text(outputs)
        (deferred_text.py), which must run before the outputs are read and before the next
        update (which raises if not)."""
        if not output.has_rows():
            return []
        if not self._inflight_step_ids or self._inflight_step_ids[0] != output.step_id:
            raise RuntimeError(f"step {output.step_id} applied out of order; "
                               f"in flight: {list(self._inflight_step_ids)}")
        if self.deferred_text:
            raise RuntimeError("fill_text() of the previous step's outputs was not called")
        self._inflight_step_ids.popleft()
        logprobs = StepLogprobs(result)
        if result is not None and result.prompt_logprobs is not None:
            collect_prompt_logprobs(self.requests, result.prompt_logprobs)
        outputs, missing = [], []
        counts = [r.num_scheduled_tokens for r in output.new_requests]
        counts += output.cached_requests.num_scheduled_tokens
        requests, spec, finished = self.requests, self.spec_steps, RequestStatus.FINISHED  # (per row)
        running, held, deferred, append = RequestStatus.RUNNING, self.held, self.deferred_text, outputs.append
        caching, block_size = self.kv.enable_caching, self.config.block_size
        for req_id, num_tokens in zip(output.scheduled_req_ids, counts):
            request = requests[req_id]
            # Steps in flight add a pending token at most, non-sampling ones (chunks) first:
            # this oldest step sampled exactly when every step in flight did.
            should_sample = request.num_pending_tokens == request.num_inflight_steps
            request.num_inflight_steps -= 1
            token_id = sampled.get(req_id)  # a list of token ids for a verify step ([]: void)
            if request.spec_rows and request.spec_rows[0].step_id == output.step_id:  # a verify row
                num_tokens -= spec.settle(request, token_id)  # rejected drafts, void rows: KV void
            status = request.status
            if status is not finished:  # (a failed step aborts its requests first)
                # its KV is there: a block it filled is shared (counted here, indexed by kv.cache_full_blocks)
                written = request.num_written_tokens = request.num_written_tokens + num_tokens
                if caching and written >= (request.num_cached_blocks + 1) * block_size:
                    self.kv.cache_full_blocks(request)
                if held.num_held:
                    held.release(request, self.waiting)  # samples waiting for its prompt KV
            if token_id is not None and request.num_pending_tokens > 0:
                request.num_pending_tokens -= 1
                if status is not finished and token_id != []:
                    # most rows: no rule can end it, its text waits (deferred_text.py)
                    out = continuing_output(request, token_id, deferred) if token_id.__class__ is int else None
                    if out is None:
                        try:  # one row at a time (docs/hardening.md); costs nothing until it raises
                            out = self._append_tokens(request, token_id, logprobs)
                        except StepResultError:
                            raise  # the executor's breach (logprobs missing), no one request's fault
                        except Exception as e:  # noqa: BLE001 - its own text, stop strings: it fails alone
                            self._fail_alone(req_id, e)
                    if out is not None:
                        append(out)
            elif token_id is None and should_sample and status is running:
                missing.append(req_id)
            if request.status is not running:  # (_release_blocks keeps a running request's)
                self._release_blocks(request)
        if missing:
            raise StepResultError(f"step {output.step_id} returned no token for requests {missing[:8]}")
        if spec is not None:
            spec.on_step(sampled)
        return outputs if defer_text else self.fill_text(outputs)

    def fill_text(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """outputs (of the last update_from_output) with the text of their continuing rows
        decoded; a row whose detokenizer raises fails alone and is left out (take_failed)."""
        if not self.deferred_text:
            return outputs
        failed = self.deferred_text.fill(self._fail_alone)
        return [o for o in outputs if o.req_id not in failed] if failed else outputs

    def _fail_alone(self, req_id: int, e: Exception) -> None:
        self._failed[req_id] = e
        self.abort_request(req_id)  # unless it finished: its slot and blocks go back

    def _append_tokens(self, request: Request, token_ids: int | list[int],
                       logprobs: StepLogprobs) -> RequestOutput:
        """Appends a step's token (a verify step's: its tokens up to the first that finishes)."""
        out = tokens_output(request, token_ids, self.config.eos_token_ids,
                            self.config.max_model_len, logprobs)
        if out.finish_reason is not None:
            self._finish(request, out.finish_reason)
        return out
