"""A speculating request's verify rows in flight, oldest first (no torch): recording them,
the tokens a chain of them assumes, and settling each one's result.

A verify row is chained when it was planned while the request's previous verify row was still
in flight, on the assumption that that row accepts every draft (docs/scheduler.md, "Verify rows
that keep the pipeline"): its positions follow the previous row's last draft, its first input is
that row's token (fed on the device), and its drafts continue the n-gram match past the
previous row's drafts and the token the match predicts after them (the guess); with a draft
model, as many drafts as the executor's draft proposes on the device after the previous row. When
a row accepts fewer than all its drafts, every row chained after it is void: its slots are given
back at once here (num_computed_tokens), and the executor answers it with no token.
"""

from __future__ import annotations

from dataclasses import dataclass

from step_protocol.domain import DraftSlots

from ..logprobs import StepResultError
from ..request import Request, RequestStatus


@dataclass(slots=True)
class VerifyRow:
    """One verify row in flight: its step, its drafts (DraftSlots: a draft model's), whether it
    is chained, the token a row chained after it assumed as its last (None: none chained yet),
    and whether it is known to be void."""

    step_id: int
    drafts: list[int]
    chained: bool = False
    guess: int | None = None
    void: bool = False

    @property
    def num_tokens(self) -> int:
        """Its slots: its first token and its drafts (= the tokens it yields if all accepted)."""
        return 1 + len(self.drafts)


def assumed_tail(request: Request) -> list[int]:
    """The ids the request's n-gram rows in flight assume after its known tokens, all but the
    last row's bonus: each row's drafts, then the guess of the row chained after it."""
    rows = list(request.spec_rows)
    tail: list[int] = []
    for row in rows[:-1]:
        tail += row.drafts
        tail.append(row.guess)
    return tail + rows[-1].drafts


def chainable(request: Request) -> int:
    """How many tokens the request's rows in flight yield if every draft is accepted, when a
    chained row may follow them (some rows, none void, and they are all it has in flight:
    every slot after its known tokens is theirs); else 0."""
    rows = request.spec_rows
    if not rows or any(r.void for r in rows):
        return 0
    assumed = sum(r.num_tokens for r in rows)
    ok = (request.num_pending_tokens == len(rows)
          and request.num_computed_tokens == request.num_tokens - 1 + assumed)
    return assumed if ok else 0


def settle_row(request: Request, token_ids: int | list[int] | None) -> tuple[int, int, int]:
    """Applies the result of the request's oldest verify row: (its slots whose KV is void — the
    rejected drafts, or all of a void row's —, drafts verified, drafts accepted; a void row
    verified none). Moves num_computed_tokens back over the rejected drafts and over the rows
    chained after a row that rejected any (void from now on). token_ids None: a failed step."""
    row = request.spec_rows.popleft()
    if token_ids is None:  # a failed step: its requests are aborted
        return (row.num_tokens if row.void else len(row.drafts)), 0, 0
    token_ids = [token_ids] if isinstance(token_ids, int) else token_ids
    if row.void:
        if token_ids:
            raise StepResultError(f"request {request.req_id}: tokens {token_ids} for a void chained "
                                  "verify row (an earlier row of its chain rejected a draft)")
        return row.num_tokens, 0, 0
    drafts, accepted = row.drafts, len(token_ids) - 1
    known = not isinstance(drafts, DraftSlots)  # draft_model: only their count is known here
    if not 0 <= accepted <= len(drafts) or (known and token_ids[:accepted] != drafts[:accepted]):
        raise StepResultError(f"request {request.req_id}: tokens {token_ids} do not extend "
                              f"an accepted prefix of its drafts {drafts}")
    rejected = len(drafts) - accepted
    running = request.status is RequestStatus.RUNNING  # (a preempted one starts again from 0)
    if running:
        request.num_computed_tokens -= rejected
    if rejected:
        for later in request.spec_rows:  # planned on this row accepting all: void
            later.void = True
            if running:
                request.num_computed_tokens -= later.num_tokens
    return rejected, len(drafts), accepted
