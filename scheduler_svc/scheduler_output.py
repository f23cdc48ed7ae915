"""What the scheduler hands out: the step plan for the executor and per-request outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import FinishReason, SamplingParams


@dataclass
class NewRequestData:
    """A request the executor has no row for: sent in full, once (again after preemption)."""

    req_id: int
    # Every token id known so far: the prompt, plus the tokens generated before a preemption.
    token_ids: list[int]
    params: SamplingParams
    # The whole block table; later steps send only appended blocks.
    block_ids: list[int]
    # Tokens whose KV is already in the cache (0 until prefix caching).
    num_computed_tokens: int
    # Tokens to compute this step, starting at num_computed_tokens (a chunk may stop short).
    num_scheduled_tokens: int


@dataclass
class CachedRequestData:
    """A request the executor already holds a row for: only what changed."""

    req_id: int
    # Blocks appended to the block table this step (often none).
    new_block_ids: list[int]
    # Tokens to compute this step; a decode row is 1 and carries no token id because the
    # executor feeds its own last sample.
    num_scheduled_tokens: int


@dataclass
class SchedulerOutput:
    """The plan of one step."""

    step_id: int
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    # Requests that finished or were aborted since the last plan: the executor drops their rows.
    finished_req_ids: list[int] = field(default_factory=list)
    # Requests preempted since the last plan: the executor drops their rows; they come back
    # later as NewRequestData.
    preempted_req_ids: list[int] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return (sum(r.num_scheduled_tokens for r in self.new_requests)
                + sum(r.num_scheduled_tokens for r in self.cached_requests))

    @property
    def scheduled_req_ids(self) -> list[int]:
        """Rows of this step, in plan order (new requests first)."""
        return ([r.req_id for r in self.new_requests]
                + [r.req_id for r in self.cached_requests])

    def is_empty(self) -> bool:
        return not (self.new_requests or self.cached_requests)


@dataclass
class RequestOutput:
    """What one step produced for one request (the client's stream item)."""

    req_id: int
    new_token_ids: list[int]
    # Text of the new tokens that is final: "" while held back (a possible stop-string start
    # or an incomplete UTF-8 character).
    new_text: str
    # Set on the request's last output only.
    finish_reason: FinishReason | None
    # The stop string, or the stop token id as decimal text, that ended the request; else "".
    matched_stop: str
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
