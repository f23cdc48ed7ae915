"""Admission of a new request, shared by the gRPC servicer and the OpenAI-compatible HTTP API:
the size checks (no tokenization), the waiting-queue bound, tokenization in the pool (refused on
the token count as soon as it is known), then the ids and sampling parameters. No grpc here."""

from __future__ import annotations

import dataclasses
import logging
import time

from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.prompts import Prompt, TokenIdsPrompt
from scheduler_svc.api.request_params import RawParams, build_sampling_params
from scheduler_svc.api.structured import GrammarCheck
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import (Limits, SizeLimits, check_prompt, check_prompt_len,
                                          check_prompt_size, check_request_size)
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import RequestError

log = logging.getLogger("llmserve.api")


class Overloaded(RequestError):
    """RESOURCE_EXHAUSTED because of load (the server is full), not because of the request's
    own size: HTTP answers 429 for it, 400 for a request too big to ever fit."""

    def __init__(self, message: str):
        super().__init__("RESOURCE_EXHAUSTED", message)


def is_overload(error: RequestError) -> bool:
    """True for a refusal that a retry later may not get (server full, tokenizer queue full)."""
    return isinstance(error, Overloaded) or (
        error.code == "RESOURCE_EXHAUSTED" and error.message.endswith("retry later"))


def limits_of(engine: EngineClient, prefix_caching: bool) -> Limits:
    info = engine.info
    return Limits(
        max_model_len=info.max_model_len, vocab_size=info.vocab_size,
        block_size=info.block_size, num_usable_blocks=info.num_blocks - 1,
        eos_token_ids=tuple(info.eos_token_ids), max_logprobs=info.max_logprobs,
        max_logit_bias=info.max_logit_bias, max_min_tokens_stop_ids=info.max_min_tokens_stop_ids,
        prefix_caching=prefix_caching,
    )


class Admission:
    """Checks, tokenizes and validates new requests for one engine: one per API process, shared
    by its doors (one capacity count, one grammar compiler and cache)."""

    def __init__(self, engine: EngineClient, tokenize_pool: TokenizePool, sizes: SizeLimits,
                 max_waiting: int, prefix_caching: bool = True, grammars: GrammarCheck | None = None):
        self.engine = engine
        self.pool = tokenize_pool
        self.sizes = sizes
        self.max_waiting = max_waiting
        self.limits = limits_of(engine, prefix_caching)
        self._grammars = grammars  # structured outputs; made at the first constraint if None
        self._num_refused_full, self._last_full_log = 0, 0.0  # refusals not yet logged

    async def admit(self, prompt: Prompt | None, raw: RawParams, request_id: str
                    ) -> tuple[list[int], SamplingParams]:
        """(prompt token ids, sampling params); RequestError when the request is refused."""
        check_prompt_size(prompt, self.sizes, self.limits)
        check_request_size(raw, request_id, self.sizes)
        self.check_capacity(1 if raw.n is None else raw.n)
        prompt_ids = await self.prompt_ids(prompt)
        check_prompt(prompt_ids, self.limits)
        params = build_sampling_params(raw, len(prompt_ids), self.limits)
        if params.constraint is not None:  # compiled off the loop, last: the costliest check
            params = dataclasses.replace(params, grammar=await self.grammars.check(params.constraint))
        return prompt_ids, params

    def close(self) -> None:
        if self._grammars is not None:
            self._grammars.close()

    @property
    def grammars(self) -> GrammarCheck:
        if self._grammars is None:
            self._grammars = GrammarCheck(self.pool.tokenizer, self.limits.vocab_size,
                                          self.limits.eos_token_ids)
        return self._grammars

    def check_capacity(self, n: int) -> None:
        """At most max_num_seqs running plus --max-waiting waiting requests (each sample counts);
        counted here, as they are admitted, so a burst cannot outrun the engine core's (one step
        old) figures."""
        capacity = self.engine.info.max_num_seqs + self.max_waiting
        if self.engine.num_requests + n > capacity:
            self._num_refused_full += 1
            if time.monotonic() - self._last_full_log >= 1.0:  # a burst logs once a second
                log.warning("server full: refused %d requests (%d running or waiting, --max-waiting %d)",
                            self._num_refused_full, self.engine.num_requests, self.max_waiting)
                self._last_full_log, self._num_refused_full = time.monotonic(), 0
            raise Overloaded(f"the server is full ({capacity} requests running or waiting, "
                             f"--max-waiting {self.max_waiting}); retry later")

    async def prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, TokenIdsPrompt):
            return list(prompt.ids)
        encoded = await self.pool.encode(prompt, self.limits.max_model_len - 1)
        check_prompt_len(encoded.num_tokens, self.limits)
        return encoded.token_ids
