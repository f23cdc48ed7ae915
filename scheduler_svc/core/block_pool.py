"""The KV block pool: which blocks of the executor's cache are free, and who holds the rest.

The executor owns the cache memory; this is only the bookkeeping. Block 0 is the null block:
padded rows of a replayed CUDA graph write their KV there, so it is never handed out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

NULL_BLOCK_ID = 0


@dataclass
class Block:
    """One KV block. ref_count > 1 will mean shared by equal prefixes (prefix caching)."""

    block_id: int
    ref_count: int = 0
    # Chained hash of the block's tokens and its predecessor's hash, set once the block is
    # full (prefix caching; -1 = not hashed). Equal hashes mean equal prefixes.
    block_hash: int = -1


def hash_block_tokens(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """The chained hash of a full block: equal only for equal token prefixes."""
    return hash((parent_hash, token_ids))


class BlockPool:
    """A free list of blocks with reference counts. Paired verbs: can_allocate/allocate, free."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[NULL_BLOCK_ID].ref_count = 1  # held forever
        # FIFO: a freed block goes to the back, so recently freed blocks (and, later, their
        # cached prefixes) are reused last.
        self.free_block_ids: deque[int] = deque(range(1, num_blocks))
        # Prefix cache index (filled once prefix caching lands): block_hash -> block_id.
        self.hash_to_block_id: dict[int, int] = {}

    @property
    def num_total_blocks(self) -> int:
        """Blocks that can be handed out (all but the null block)."""
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_block_ids)

    def allocate(self, num_blocks: int) -> list[int]:
        """Takes num_blocks free blocks (caller checked can_allocate) and returns their ids."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        block_ids = [self.free_block_ids.popleft() for _ in range(num_blocks)]
        for block_id in block_ids:
            block = self.blocks[block_id]
            assert block.ref_count == 0, block
            block.ref_count = 1
            block.block_hash = -1
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference to each block; a block with none left returns to the free list."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block_id == NULL_BLOCK_ID or block.ref_count <= 0:
                raise RuntimeError(f"freeing block {block_id} that is not allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
