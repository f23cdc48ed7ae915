"""What the scheduler core hands back per request and step (the client's stream items)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from step_protocol.domain import Logprobs

from .request import FinishReason

# One generated token's logprobs: (token id, logprob, rank, top ids, top logprobs), the top
# lists cut to what the request asked for.
LogprobEntry = tuple


@dataclass
class LogprobColumns:
    """Logprobs of consecutive prompt positions as compact columns (arrays: a long prompt's
    cross the pipe as a few byte strings, not a million Python numbers), num_top alternatives
    each. Rank 0 marks a position without a logprob: the first prompt token."""

    num_top: int
    token_ids: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    ranks: array = field(default_factory=lambda: array("i"))
    top_token_ids: array = field(default_factory=lambda: array("i"))
    top_logprobs: array = field(default_factory=lambda: array("f"))

    @classmethod
    def starting_with(cls, first_token_id: int, num_top: int) -> LogprobColumns:
        """Columns whose position 0 is the first prompt token (no logprob)."""
        out = cls(num_top)
        out.token_ids.append(first_token_id)
        out.logprobs.append(0.0)
        out.ranks.append(0)
        out.top_token_ids.extend([0] * num_top)
        out.top_logprobs.extend([0.0] * num_top)
        return out

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend_from(self, lp: Logprobs, start: int, count: int) -> None:
        """Appends positions start .. start + count - 1 of lp, cut to num_top alternatives."""
        end, n, k = start + count, lp.num_top, self.num_top
        self.token_ids.extend(lp.token_ids[start:end])
        self.logprobs.extend(lp.logprobs[start:end])
        self.ranks.extend(lp.ranks[start:end])
        if n == k:
            self.top_token_ids.extend(lp.top_token_ids[start * n:end * n])
            self.top_logprobs.extend(lp.top_logprobs[start * n:end * n])
            return
        for i in range(start * n, end * n, n):
            self.top_token_ids.extend(lp.top_token_ids[i:i + k])
            self.top_logprobs.extend(lp.top_logprobs[i:i + k])

    def entries(self) -> list[LogprobEntry]:
        """The positions as LogprobEntry tuples (logprob None where rank is 0)."""
        k = self.num_top
        return [(t, None if r == 0 else lp, r, list(self.top_token_ids[i * k:(i + 1) * k]) if r else [],
                 list(self.top_logprobs[i * k:(i + 1) * k]) if r else [])
                for i, (t, lp, r) in enumerate(zip(self.token_ids, self.logprobs, self.ranks))]


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
    # With logprobs: one LogprobEntry per new_token_ids entry (they travel together); else None.
    logprobs: list[LogprobEntry] | None = None
    # With prompt_logprobs: every prompt position, on the request's first output only.
    prompt_logprobs: LogprobColumns | None = None
    # Which sample of its client request (set by the API process; not sent over the pipe).
    index: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
