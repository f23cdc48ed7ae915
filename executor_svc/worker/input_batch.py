"""Per-request rows that persist across steps (the static step inputs are in step_buffers.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from step_protocol.domain import NewRequestData


@dataclass
class RequestState:
    """What the executor remembers of one running request (its counters live in InputBatch rows)."""

    req_id: int
    row: int  # row in the persistent tables (block table, counters; the Sampler's, the draft's)
    token_ids: np.ndarray  # [num_known] int64: tokens the scheduler sent (prompt + pre-preemption output)


class InputBatch:
    """Persistent per-request rows: which request holds each row, its block table and token
    counters (the sampling state of a row is the Sampler's, sample/). The per-row numpy
    arrays let a step be prepared with whole-array operations."""

    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int):
        s = max_num_seqs
        self.max_num_seqs, self.max_blocks_per_seq = max_num_seqs, max_blocks_per_seq
        self.requests: dict[int, RequestState] = {}
        self.states: list[RequestState | None] = [None] * s  # by row
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.block_table = np.zeros((s, max_blocks_per_seq), dtype=np.int32)
        self.num_blocks = np.zeros(s, dtype=np.int64)  # blocks in the row's table
        self.num_computed = np.zeros(s, dtype=np.int64)  # tokens whose KV is computed (or enqueued)
        self.num_known = np.zeros(s, dtype=np.int64)  # len(token_ids): tokens the scheduler sent

    def add(self, new: NewRequestData) -> RequestState:
        if new.req_id in self.requests:
            raise ValueError(f"request {new.req_id} is already running")
        if not self.free_rows:
            raise ValueError(f"more than max_num_seqs={self.max_num_seqs} running requests")
        row = self.free_rows.pop()
        state = RequestState(new.req_id, row, np.asarray(new.token_ids, dtype=np.int64).reshape(-1))
        self.requests[new.req_id] = state
        self.states[row] = state
        # All or nothing: a request whose row cannot be set up (a value its arrays cannot
        # take) is forgotten again, and its row is free for the next
        # request, which overwrites every field below (a failed add fails that request alone).
        try:
            self.block_table[row] = 0
            self.num_blocks[row] = 0
            self.num_computed[row] = new.num_computed_tokens
            self.num_known[row] = len(state.token_ids)
            self.append_blocks(state, new.block_ids)
        except BaseException:
            self.remove(new.req_id)
            raise
        return state

    def req_of_row(self, row: int) -> int | None:
        """The request a row holds, or None."""
        return None if (state := self.states[row]) is None else state.req_id

    def rows_of(self, req_ids: list[int]) -> np.ndarray:
        """[n] int64: the rows of running requests, in the given order. KeyError for an id that
        is not running."""
        requests = self.requests
        try:
            return np.fromiter((requests[r].row for r in req_ids), dtype=np.int64, count=len(req_ids))
        except KeyError as e:
            raise KeyError(f"cached request {e.args[0]} is not running on the executor") from None

    def append_blocks(self, state: RequestState, block_ids: list[int]) -> None:
        if not block_ids:
            return
        row = state.row
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.max_blocks_per_seq:
            raise ValueError(f"request {state.req_id}: {end} blocks > max {self.max_blocks_per_seq}")
        self.block_table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def give_back(self, rollbacks: list[tuple[int, int]]) -> None:
        """Rejected drafts' slots (row, n): the row's last n computed tokens are not its own."""
        for row, n in rollbacks:
            self.num_computed[row] -= n

    def remove(self, req_id: int) -> None:
        """Forgets a request (finished, aborted or preempted); unknown ids are ignored."""
        state = self.requests.pop(req_id, None)
        if state is not None:
            self.block_table[state.row] = 0
            self.num_blocks[state.row] = 0
            self.states[state.row] = None
            self.free_rows.append(state.row)

    def clear(self) -> None:
        for req_id in list(self.requests):
            self.remove(req_id)
