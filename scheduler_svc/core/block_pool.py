"""The KV block pool: which blocks of the executor's cache are free, who holds the rest, and
which full blocks hold a known prefix (prefix caching).

The executor owns the cache memory; this is only the bookkeeping. Block 0 is the null block:
padded rows of a replayed CUDA graph write their KV there, so it is never handed out.

Free blocks (ref count 0) wait in an LRU queue: the head is taken first. A free block may
still be cached (indexed by its hash): it keeps its KV until it is taken, and a request whose
prefix matches takes it back out of the queue instead (touch). Taking a cached block from the
head evicts it: its hash leaves the index.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

NULL_BLOCK_ID = 0
BlockHash = bytes  # a sha256 digest
_NO_PARENT = bytes(32)


@dataclass
class Block:
    """One KV block; ref_count > 1 means shared by requests with an equal prefix."""

    block_id: int
    ref_count: int = 0
    # Chained hash of the block's tokens, set once the block is full and its KV written (then
    # the block is in the prefix index); None = not cached.
    block_hash: BlockHash | None = None


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int],
                      extra_keys: tuple = ()) -> BlockHash:
    """The chained hash of a full block: equal only for equal token prefixes (and equal
    extra_keys: anything else the KV depends on, each tagged with its kind, e.g.
    ("lora", name) or ("salt", salt); none exist yet).

    sha256 rather than Python's hash() (vLLM's default since v0.10.2): with a 64-bit
    non-cryptographic hash a client can craft a prompt whose blocks collide with another
    client's and compute on KV made from their tokens (vLLM advisory GHSA-rm76-4mrf-v9r8).
    It costs about 1 us a block, once per block of a request.
    """
    h = hashlib.sha256(parent_hash or _NO_PARENT)
    h.update(len(token_ids).to_bytes(4, "little"))
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class BlockPool:
    """Reference counts, the LRU free queue and the prefix index.

    Paired verbs: can_allocate/allocate, free; touch takes cached blocks (a prefix hit),
    cache_block indexes a full, written block.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[NULL_BLOCK_ID].ref_count = 1  # held forever
        # Blocks with ref count 0, least recently freed first (an ordered set: a hit takes a
        # block out of the middle in O(1)).
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.hash_to_block_id: dict[BlockHash, int] = {}  # the prefix index

    @property
    def num_total_blocks(self) -> int:
        """Blocks that can be handed out (all but the null block)."""
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no holder, cached ones included (they are evicted when taken)."""
        return len(self.free_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block_id)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_block_ids)

    def allocate(self, num_blocks: int) -> list[int]:
        """Takes num_blocks blocks from the head of the free queue, evicting cached ones."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        block_ids = [self.free_block_ids.popitem(last=False)[0] for _ in range(num_blocks)]
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count == 0, block
            block.ref_count = 1
            self._evict(block)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference to each block; a block with none left joins the tail of the
        free queue (cached blocks stay indexed until evicted)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block_id == NULL_BLOCK_ID or block.ref_count <= 0:
                raise RuntimeError(f"freeing block {block_id} that is not allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block holding the prefix that ends with block_hash, if still cached."""
        return self.hash_to_block_id.get(block_hash)

    def touch(self, block_ids: list[int]) -> None:
        """Adds a holder to cached blocks (a prefix hit); free ones leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.block_hash is not None, block
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Indexes a held block that is full and whose KV is written. A block whose prefix is
        already cached elsewhere (computed twice) stays unindexed: one block per hash."""
        block = self.blocks[block_id]
        assert block.ref_count > 0, block
        if block.block_hash is None and block_hash not in self.hash_to_block_id:
            block.block_hash = block_hash
            self.hash_to_block_id[block_hash] = block_id

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            del self.hash_to_block_id[block.block_hash]
            block.block_hash = None
