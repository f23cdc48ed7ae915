"""Speculative decoding on the scheduler side (no torch): the n-gram (prompt lookup) drafts
(ngram.py), how many drafts a request may verify in a step, and settling a verify step's result
(the rejected drafts' slots go back, the acceptance counters). See docs/scheduler.md,
"Speculative decoding"; the executor verifies (executor_svc/spec_decode/verify.py). With method
draft_model the executor's draft model proposes (executor_svc/spec_decode/draft.py): the scheduler
decides only how many drafts a row gets (DraftSlots).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmserve.speculative import SpecDecodeConfig
from step_protocol.domain import DraftSlots, ExecutorInfo

from ..logprobs import StepLogprobs, token_output
from ..outputs import RequestOutput
from ..request import Request
from .ngram import NgramIndex
from .rows import VerifyRow, assumed_tail, chainable, settle_row

def check_executor(config: SpecDecodeConfig | None, info: ExecutorInfo) -> None:
    """At the handshake: ValueError when the speculation asked for does not match the
    executor (draft_model needs an executor with a draft model; one that has a draft model
    proposes the drafts itself, so it takes no n-gram drafts)."""
    method = config.method if config is not None else None
    if method == "draft_model" and not info.draft_model_path:
        raise ValueError("--speculative-config method draft_model: the executor has no draft model "
                         "(start it with the same --speculative-config, naming the draft's \"model\")")
    if method == "ngram" and info.draft_model_path:
        raise ValueError(f"--speculative-config method ngram: the executor proposes with its draft model "
                         f"{info.draft_model_path} (use method draft_model, or start it without one)")


@dataclass
class SpecDecodeStats:
    """Running totals (vLLM's spec_decode counters): verify rows, drafts, accepted drafts."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def take(self) -> tuple[int, int, int]:
        out = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        return out


class SpecDecoder:
    """Proposes drafts for decode rows whose tokens are all known, and settles the results."""

    def __init__(self, config: SpecDecodeConfig, max_model_len: int, eos_token_ids: tuple[int, ...]):
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.stats = SpecDecodeStats()

    def eligible(self, request: Request) -> bool:
        """Requests whose sampling the verifier implements: no logits processors (their state
        is per position), no logprobs (the verifier returns none) and no structured-output
        constraint (drafts are not yet checked against a grammar)."""
        if request.spec_eligible is None:
            p = request.params
            request.spec_eligible = (p.logprobs is None and p.prompt_logprobs is None
                                     and p.constraint is None
                                     and not p.sampler_params(self.eos_token_ids).uses_processors)
        return request.spec_eligible

    def propose(self, request: Request, budget: int) -> list[int]:
        """Drafts for a decode row of `request` (its last token known, none in flight) within
        `budget` more tokens of this step, max_tokens and the context; [] = a plain decode."""
        if request.num_pending_tokens or request.num_computed_tokens != request.num_tokens - 1:
            return []
        k = min(self.config.num_speculative_tokens, budget,
                request.params.max_tokens - request.num_output_tokens - 1,  # 1 + k tokens out
                self.max_model_len - request.num_tokens - 1)
        if k <= 0 or not self.eligible(request):
            return []
        if self.config.method == "draft_model":  # the executor's draft model proposes them
            return DraftSlots(k)
        index = request.ngram_index
        if index is None:
            index = request.ngram_index = NgramIndex(self.config.prompt_lookup_min,
                                                     self.config.prompt_lookup_max)
        return index.propose(request.token_ids_between, request.num_tokens, k)

    def propose_chained(self, request: Request, budget: int) -> list[int]:
        """Drafts of a chained verify row (rows.py) after the request's rows in flight,
        within `budget` tokens of this step (the row takes 1 + drafts): the n-gram continuation
        of its known tokens followed by the tokens its rows assume, past the token the match
        predicts after them (their last row's guess, recorded here); with a draft model
        DraftSlots (the executor's draft proposes them). [] = none: it waits for its results (a
        void row, max_tokens or the context reached, no match)."""
        draft_model = self.config.method == "draft_model"
        assumed = chainable(request) if draft_model or request.ngram_index is not None else 0
        if not assumed:
            return []
        k = min(self.config.num_speculative_tokens, budget - 1,
                request.params.max_tokens - request.num_output_tokens - assumed - 1,
                self.max_model_len - request.num_tokens - assumed - 1)
        if k <= 0:
            return []
        if draft_model:  # the executor's draft proposes them, after the previous row's on the device
            return DraftSlots(k)
        after = request.ngram_index.propose_after(request.token_ids_between, request.num_tokens,
                                                  assumed_tail(request), k + 1)
        if len(after) < 2:
            return []
        request.spec_rows[-1].guess = after[0]
        return after[1:]

    def record(self, request: Request, step_id: int, drafts: list[int], chained: bool) -> None:
        """A verify row of `request` is in the plan of step_id."""
        request.spec_rows.append(VerifyRow(step_id, drafts, chained))

    def settle(self, request: Request, token_ids: int | list[int] | None) -> int:
        """Applies the result of the request's oldest verify row (rows.settle_row): returns
        its slots whose KV is void, counts its drafts."""
        void, num_drafts, accepted = settle_row(request, token_ids)
        if num_drafts:
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += num_drafts
            self.stats.num_accepted_tokens += accepted
        return void


def tokens_output(request: Request, token_ids: int | list[int], eos_token_ids: tuple[int, ...],
                  max_model_len: int, logprobs: StepLogprobs) -> RequestOutput:
    """logprobs.token_output of a step's token, or of a verify step's tokens up to the first
    that finishes the request (none past it is appended or streamed), as one output."""
    if isinstance(token_ids, int):
        return token_output(request, token_ids, eos_token_ids, max_model_len, logprobs)
    outs = []
    for token_id in token_ids:
        outs.append(token_output(request, token_id, eos_token_ids, max_model_len, logprobs))
        if outs[-1].finish_reason is not None:
            break
    return merge_outputs(outs)


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """The outputs of one request's tokens of one step, as one output (in order)."""
    if len(outputs) == 1:
        return outputs[0]
    first, last = outputs[0], outputs[-1]
    logprobs = None if first.logprobs is None else [e for o in outputs for e in o.logprobs]
    return RequestOutput(first.req_id, [t for o in outputs for t in o.new_token_ids],
                         "".join(o.new_text for o in outputs), last.finish_reason, last.matched_stop,
                         first.num_prompt_tokens, last.num_output_tokens, logprobs,
                         first.prompt_logprobs)
