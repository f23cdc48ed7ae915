"""A request's state as the scheduler sees it: tokens, progress, blocks, text state."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from step_protocol.domain import SamplerParams


@dataclass(frozen=True)
class SamplingParams:
    """What the client asked for: sampling (run by the executor) and stop rules (run here)."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False  # a matched stop string ends the text, not cut

    def sampler_params(self) -> SamplerParams:
        """The part the executor's sampler needs (sent once with the request)."""
        return SamplerParams(self.temperature, self.top_k, self.top_p, self.seed)


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

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Request({self.req_id}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, "
                f"pending={self.num_pending_tokens}, blocks={self.block_ids})")
