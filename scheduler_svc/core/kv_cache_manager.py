"""Block tables of requests: how many slots a step needs, which blocks provide them, and which
full blocks are shared through the prefix cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .block_pool import BlockPool, hash_block_tokens
from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_blocks_needed(num_prompt_tokens: int, max_tokens: int, max_model_len: int,
                      block_size: int) -> int:
    """The most KV blocks a request can ever hold: one slot per token but the last sampled
    one, which is never fed back. The one rule validation and admission both use."""
    num_slots = min(num_prompt_tokens + max_tokens, max_model_len) - 1
    return cdiv(num_slots, block_size)


def check_runnable(request: Request, max_model_len: int, block_size: int, num_total_blocks: int) -> None:
    """Raises ValueError for a request that can never run: an empty prompt or one that fills
    the context, max_tokens < 1, more KV blocks than the cache has."""
    num_prompt, max_tokens = request.num_prompt_tokens, request.params.max_tokens
    if not 0 < num_prompt < max_model_len:
        raise ValueError(f"prompt has {num_prompt} tokens; need 1 to {max_model_len - 1}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    num_blocks = max_blocks_needed(num_prompt, max_tokens, max_model_len, block_size)
    if num_blocks > num_total_blocks:
        raise ValueError(f"request needs up to {num_blocks} KV blocks; the cache has {num_total_blocks}")


@dataclass
class PrefixCacheStats:
    """Running totals, in tokens, of admitted requests: looked up in the cache, found there."""

    num_queries: int = 0
    num_hits: int = 0

    def take(self) -> tuple[int, int]:
        """(queries, hits) since the last take."""
        out = (self.num_queries, self.num_hits)
        self.num_queries = self.num_hits = 0
        return out


class KVCacheManager:
    """Grows and frees requests' block tables over a BlockPool, sharing cached prefixes.

    Token regions of a request when a step is planned:

        |<----------------- num_tokens_with_pending ----------------->|
        |<-------- num_tokens (ids known here) -------->|<- pending ->|
        |<--- num_computed_tokens --->|<------- num_new_tokens ------>|
        |<-- written -->|  (KV of steps applied; full blocks here are cacheable)
        |<--- block_ids (already held) --->|<----- new blocks ----->|

    Pending tokens were sampled by a step still in flight: the executor feeds them itself, so
    they need a slot (and maybe a block) before their id is known here. A prefill chunk
    stops short of the right edge; a decode step is the one pending (or last known) token.
    allocate_slots makes the block table cover num_computed_tokens + num_new_tokens slots and
    returns only the blocks it appended (the delta the executor needs).

    Prefix caching: a block is indexed once it is full of known tokens and a step that wrote
    it has been applied (cache_full_blocks), so no request is offered KV that a step in
    flight is still writing. A cached block is only read: a hit never covers a request's last
    token, and a request only writes positions from its num_computed_tokens on.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.stats = PrefixCacheStats()

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest cached prefix of full blocks of a request that holds no blocks. At
        least one token is left to compute so that the row samples: a fully cached prompt
        backs off by one block (never by writing into a shared block)."""
        if not self.enable_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(request, max_blocks)[:max_blocks]:
            block_id = self.pool.cached_block(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_blocks_needed(self, request: Request, num_new_tokens: int,
                          num_computed_blocks: int = 0) -> int:
        """New blocks for num_new_tokens more slots; num_computed_blocks cached blocks (not
        yet in block_ids, nor in num_computed_tokens) come before them."""
        num_slots = request.num_computed_tokens + num_computed_blocks * self.block_size + num_new_tokens
        num_held = len(request.block_ids) + num_computed_blocks
        return max(0, cdiv(num_slots, self.block_size) - num_held)

    def can_allocate_slots(self, request: Request, num_new_tokens: int,
                           computed_blocks: Sequence[int] = ()) -> bool:
        # A hit on a free cached block takes it out of the free queue too.
        blocks = self.pool.blocks
        num_evictable = sum(blocks[b].ref_count == 0 for b in computed_blocks) if computed_blocks else 0
        num_new = self.num_blocks_needed(request, num_new_tokens, len(computed_blocks))
        return self.pool.can_allocate(num_new + num_evictable)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[int] = ()) -> list[int]:
        """Appends computed_blocks (a prefix hit, for a request without blocks) and the blocks
        needed for num_new_tokens more tokens; returns the newly allocated block ids."""
        num_new = self.num_blocks_needed(request, num_new_tokens, len(computed_blocks))
        if not num_new and not computed_blocks:
            return []  # (most decode steps: the slot is in the last block)
        if computed_blocks:
            assert not request.block_ids, request
            self.pool.touch(computed_blocks)  # first: allocate must not evict them
            request.block_ids.extend(computed_blocks)
            request.num_cached_blocks = len(computed_blocks)
            request.num_written_tokens = len(computed_blocks) * self.block_size
        new_block_ids = self.pool.allocate(num_new)
        request.block_ids.extend(new_block_ids)
        return new_block_ids

    def record_admission(self, request: Request, num_hit_tokens: int) -> None:
        """Counts an admitted request's prefix-cache lookup (tokens queried, tokens hit)."""
        if self.enable_caching:
            self.stats.num_queries += request.num_tokens
            self.stats.num_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Indexes the request's blocks that are full of known tokens whose KV is written (the
        scheduler counts num_written_tokens as each step is applied and calls this once a
        block may have filled)."""
        written = request.num_written_tokens
        if not self.enable_caching:
            return
        known = request.num_tokens
        num_full = (written if written < known else known) // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        hashes = self._block_hashes(request, num_full)
        for i in range(request.num_cached_blocks, num_full):
            self.pool.cache_block(request.block_ids[i], hashes[i])
        request.num_cached_blocks = num_full

    def free(self, request: Request) -> None:
        """Returns all of the request's blocks to the pool, tail first (so its last blocks are
        evicted first); cached ones stay findable until evicted."""
        self.pool.free(request.block_ids[::-1])
        request.block_ids = []
        request.num_written_tokens = request.num_cached_blocks = 0

    def num_blocks_freeing(self, holders: list[Request]) -> int:
        """Held blocks that no request in holders holds (they come back once the steps in
        flight of their finished or preempted holders are applied)."""
        num_held = len({b for r in holders for b in r.block_ids})
        return self.pool.num_total_blocks - self.pool.num_free_blocks - num_held

    def _block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """request.block_hashes, extended to (at least) num_blocks full blocks of known tokens."""
        hashes, bs = request.block_hashes, self.block_size
        for i in range(len(hashes), min(num_blocks, request.num_tokens // bs)):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, request.token_ids_between(i * bs, i * bs + bs)))
        return hashes
