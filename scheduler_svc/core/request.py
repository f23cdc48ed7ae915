"""A request's state as the scheduler sees it: tokens, progress, blocks, text state."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from llmserve.structured.constraint import Constraint
from step_protocol.domain import NewRequestData, SamplerParams


@dataclass(frozen=True)
class SamplingParams:
    """What the client asked for: sampling (run by the executor) and stop rules (run here).
    vLLM's names and meanings."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False  # a matched stop string ends the text, not cut
    n: int = 1  # parallel samples of the prompt (core/samples.py makes one Request each)
    # Logprobs of each sampled token with this many alternatives (0 = the token's own only);
    # None = none. prompt_logprobs: the same for each prompt token after the first.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids distinct
    min_tokens: int = 0  # no stop condition but length ends the request before this many tokens
    # Structured outputs: what the text must match, validated and compiled for the served
    # tokenizer at admission (api/structured.py); None = unconstrained. `grammar` is its
    # llguidance grammar text, made once by that compile: the executor masks with it
    # (SamplerParams.grammar).
    constraint: Constraint | None = None
    grammar: str = ""

    def sampler_params(self, eos_token_ids: tuple[int, ...] = ()) -> SamplerParams:
        """The part the executor's sampler needs (sent once with the request). min_tokens
        masks the model's EOS ids (unless ignore_eos) and the stop token ids."""
        stop_ids: tuple[int, ...] = ()
        if self.min_tokens > 0:
            eos = () if self.ignore_eos else tuple(eos_token_ids)
            stop_ids = tuple(dict.fromkeys(eos + self.stop_token_ids))
        return SamplerParams(
            self.temperature, self.top_k, self.top_p, self.seed, min_p=self.min_p,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, logit_bias=self.logit_bias,
            min_tokens=self.min_tokens, min_tokens_stop_ids=stop_ids,
            logprobs=-1 if self.logprobs is None else self.logprobs,
            prompt_logprobs=-1 if self.prompt_logprobs is None else self.prompt_logprobs,
            grammar=self.grammar)


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # back in the waiting queue; its KV must be recomputed
    FINISHED = enum.auto()


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_tokens reached or the context (max_model_len) is full
    STOP = "stop"  # a stop string or a stop token id matched
    EOS = "eos"  # the model produced an end-of-sequence token
    CANCELLED = "cancelled"  # aborted by the caller


class Request:
    """One generation request.

    Token regions (see docs/scheduler.md):
      known tokens   = prompt_token_ids + output_token_ids (their ids are here)
      pending tokens = sampled by a step in flight, not yet seen (num_pending_tokens)
      computed       = the first num_computed_tokens tokens have their KV written, or will
                       have once the steps in flight finish (advanced when scheduled)
      written        = the first num_written_tokens: KV written by steps already applied
                       (or found in the prefix cache); only these blocks may be shared
    """

    def __init__(self, req_id: int, prompt_token_ids: list[int], params: SamplingParams):
        self.req_id = req_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.arrival_order = 0  # set by Scheduler.add_request; lower = older = higher priority
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Tokens that steps in flight will sample: they occupy a KV slot in the next step
        # before their id is known here (the executor feeds its own last sample).
        self.num_pending_tokens = 0
        # Steps planned but not yet applied that include this request; its blocks may be
        # written until this is 0, so they are freed only then.
        self.num_inflight_steps = 0
        self.block_ids: list[int] = []
        # Prefix caching (kv_cache_manager.py): hashes of the full blocks of known tokens
        # (token-derived, so they survive preemption), tokens whose KV a step already applied
        # has written, and how many leading blocks of block_ids are in the prefix index.
        self.block_hashes: list[bytes] = []
        self.num_written_tokens = 0
        self.num_cached_blocks = 0
        # Text state, set by the scheduler: incremental detokenizer and stop-string holdback.
        self.detokenizer: Any = None
        self.stop_matcher: Any = None
        # The per-token rules' constants, set by Scheduler.add_request (read for every row of
        # every step): ids that may end it (stop token ids, EOS unless ignore_eos), the output
        # length that ends it (max_tokens or the context), whether its text can wait until the
        # next plan is sent (no stop strings, no logprobs: logprobs.continuing_output).
        self.finish_token_ids: frozenset[int] = frozenset()
        self.num_output_limit = 0
        self.defers_text = False
        # Parallel sampling (core/samples.py): sample 0 of the same client request, whose
        # prompt KV this one waits for (None for sample 0 and for n == 1).
        self.leader: Request | None = None
        # Prompt logprobs (core/logprobs.py): the positions collected so far (LogprobColumns;
        # None before the first), and whether they went out (with the first output; once).
        self.prompt_logprobs: Any = None
        self.prompt_logprobs_sent = params.prompt_logprobs is None
        # Speculative decoding (core/spec/decoder.py): its verify rows in flight, oldest first
        # (spec/rows.VerifyRow), whether its sampling may speculate at all (None = not yet
        # asked), and the n-gram index of its tokens (NgramIndex, made at its first proposal).
        self.spec_rows: deque = deque()
        self.spec_eligible: bool | None = None
        self.ngram_index: Any = None
        self.spec_gate: Any = None  # spec/gate.GateState, made on first use

    def set_token_rules(self, eos_token_ids: tuple[int, ...], max_model_len: int) -> None:
        """finish_token_ids, num_output_limit and defers_text, from its params (stop_matcher set)."""
        p = self.params
        self.finish_token_ids = frozenset(p.stop_token_ids + (() if p.ignore_eos else tuple(eos_token_ids)))
        self.num_output_limit = min(p.max_tokens, max_model_len - len(self.prompt_token_ids))
        self.defers_text = not self.stop_matcher.stop and p.logprobs is None

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Its prompt's logits are still needed: it computes the prompt (no prefix hit)."""
        return not self.prompt_logprobs_sent

    def sampler_params(self, eos_token_ids: tuple[int, ...]) -> SamplerParams:
        """What the executor samples with; a resumed request whose prompt logprobs went out
        does not ask for them again."""
        params = self.params.sampler_params(eos_token_ids)
        if params.prompt_logprobs >= 0 and not self.wants_prompt_logprobs:
            params = replace(params, prompt_logprobs=-1)
        return params

    def new_request_data(self, num_new_tokens: int, eos_token_ids: tuple[int, ...]) -> NewRequestData:
        """Its row as it crosses to the executor once (again after a preemption), admitted with
        num_computed_tokens cached and num_new_tokens to compute."""
        return NewRequestData(self.req_id, self.all_token_ids, self.sampler_params(eos_token_ids),
                              list(self.block_ids), self.num_computed_tokens, num_new_tokens,
                              self.num_prompt_tokens)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens whose ids are known here."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        """Tokens the request has, counting those sampled by steps still in flight."""
        return self.num_tokens + self.num_pending_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """Known token ids of positions start..end-1 (without copying all of them)."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]

    def advance(self, num_new_tokens: int) -> None:
        """Scheduled for num_new_tokens more in a step (computed once that step runs)."""
        self.num_computed_tokens += num_new_tokens
        self.num_inflight_steps += 1
        # >= num_tokens_with_pending (> : drafts), inline: this runs for every row of every step
        if self.num_computed_tokens >= len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_tokens:
            self.num_pending_tokens += 1  # the row reaches the end of its tokens: it samples

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.req_id}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, "
                f"pending={self.num_pending_tokens}, blocks={self.block_ids})")
