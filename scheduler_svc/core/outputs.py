"""What the scheduler core hands back per request and step (the client's stream items)."""

from __future__ import annotations

from dataclasses import dataclass

from .request import FinishReason


@dataclass
class RequestOutput:
    """What one step produced for one request."""

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
