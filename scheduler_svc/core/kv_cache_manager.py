"""Block tables of requests: how many slots a step needs and which blocks provide them."""

from __future__ import annotations

from .block_pool import BlockPool
from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_blocks_needed(num_prompt_tokens: int, max_tokens: int, max_model_len: int,
                      block_size: int) -> int:
    """The most KV blocks a request can ever hold: one slot per token but the last sampled
    one, which is never fed back. The one rule validation and admission both use."""
    num_slots = min(num_prompt_tokens + max_tokens, max_model_len) - 1
    return cdiv(num_slots, block_size)


class KVCacheManager:
    """Grows and frees requests' block tables over a BlockPool.

    Token regions of a request when a step is planned:

        |<----------------- num_tokens_with_pending ----------------->|
        |<-------- num_tokens (ids known here) -------->|<- pending ->|
        |<--- num_computed_tokens --->|<------- num_new_tokens ------>|
        |<--- block_ids (already held) --->|<----- new blocks ----->|

    Pending tokens were sampled by a step still in flight: the executor feeds them itself, so
    they need a slot (and maybe a block) before their id is known here. A prefill chunk
    stops short of the right edge; a decode step is the one pending (or last known) token.
    allocate_slots makes the block table cover num_computed_tokens + num_new_tokens slots and
    returns only the blocks it appended (the delta the executor needs).
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        num_slots = request.num_computed_tokens + num_new_tokens
        return max(0, cdiv(num_slots, self.block_size) - len(request.block_ids))

    def can_allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        return self.pool.can_allocate(self.num_blocks_needed(request, num_new_tokens))

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int]:
        """Appends the blocks needed for num_new_tokens more tokens; returns the new block ids."""
        new_block_ids = self.pool.allocate(self.num_blocks_needed(request, num_new_tokens))
        request.block_ids.extend(new_block_ids)
        return new_block_ids

    def free(self, request: Request) -> None:
        """Returns all of the request's blocks to the pool, tail first."""
        self.pool.free(request.block_ids[::-1])
        request.block_ids = []
