import pytest

from scheduler_svc.core.block_pool import NULL_BLOCK_ID, BlockPool, hash_block_tokens
from scheduler_svc.core.kv_cache_manager import KVCacheManager
from scheduler_svc.core.request import Request, SamplingParams


def test_null_block_is_never_handed_out():
    pool = BlockPool(num_blocks=5)
    assert pool.num_total_blocks == 4 and pool.num_free_blocks == 4
    assert pool.can_allocate(4) and not pool.can_allocate(5)
    block_ids = pool.allocate(4)
    assert sorted(block_ids) == [1, 2, 3, 4] and NULL_BLOCK_ID not in block_ids
    assert pool.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_free_counts_are_exact():
    pool = BlockPool(num_blocks=9)
    a, b = pool.allocate(3), pool.allocate(2)
    assert pool.num_free_blocks == 3
    pool.free(a)
    assert pool.num_free_blocks == 6
    assert all(pool.blocks[i].ref_count == 0 for i in a)
    assert all(pool.blocks[i].ref_count == 1 for i in b)
    with pytest.raises(RuntimeError):
        pool.free(a)  # double free
    with pytest.raises(RuntimeError):
        pool.free([NULL_BLOCK_ID])
    pool.free(b)
    assert pool.num_free_blocks == pool.num_total_blocks == 8
    # Freed blocks go to the back: the never-used blocks come out first.
    assert pool.allocate(3) == [6, 7, 8]


def test_chained_hash_depends_on_prefix():
    h1 = hash_block_tokens(None, (1, 2))
    assert hash_block_tokens(h1, (3, 4)) != hash_block_tokens(hash_block_tokens(None, (9, 9)), (3, 4))
    assert hash_block_tokens(h1, (3, 4)) == hash_block_tokens(hash_block_tokens(None, (1, 2)), (3, 4))
    assert hash_block_tokens(h1, (3, 4)) != hash_block_tokens(h1, (3, 4), ("salt", "x"))
    assert hash_block_tokens(None, (1, 2)) != hash_block_tokens(None, (2, 1))
    assert len(h1) == 32  # sha256


def test_cached_free_blocks_are_evicted_lru_and_leave_the_index():
    pool = BlockPool(num_blocks=5)
    a, b = pool.allocate(2), pool.allocate(2)  # [1, 2], [3, 4]
    for block_id in a + b:
        pool.cache_block(block_id, bytes([block_id]) * 32)
    pool.free(a[::-1])  # tail first: block 2 is evicted before block 1
    assert list(pool.free_block_ids) == [2, 1] and pool.num_free_blocks == 2
    assert pool.num_cached_blocks == 4 and pool.cached_block(bytes([1]) * 32) == 1
    pool.touch([1])  # a prefix hit takes a free cached block out of the queue
    assert pool.blocks[1].ref_count == 1 and list(pool.free_block_ids) == [2]
    pool.touch([3])  # a hit on a held block shares it
    assert pool.blocks[3].ref_count == 2
    assert pool.allocate(1) == [2]  # evicts block 2: its hash is gone
    assert pool.cached_block(bytes([2]) * 32) is None and pool.blocks[2].block_hash is None
    assert pool.num_cached_blocks == 3 and pool.num_free_blocks == 0
    pool.free([3])
    assert pool.blocks[3].ref_count == 1 and pool.num_free_blocks == 0  # still held once
    pool.free([3, 1, 2, 4])
    assert list(pool.free_block_ids) == [3, 1, 2, 4] and pool.num_cached_blocks == 3


def test_a_second_block_with_a_cached_prefix_stays_unindexed():
    pool = BlockPool(num_blocks=4)
    x, y = pool.allocate(2)
    pool.cache_block(x, b"h" * 32)
    pool.cache_block(y, b"h" * 32)  # the same prefix computed twice
    assert pool.cached_block(b"h" * 32) == x and pool.blocks[y].block_hash is None


def test_allocate_slots_returns_only_new_blocks():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    request = Request(0, list(range(6)), SamplingParams(max_tokens=8))
    assert kv.num_blocks_needed(request, 6) == 2
    assert kv.allocate_slots(request, 6) == [1, 2]
    request.num_computed_tokens = 6
    assert kv.allocate_slots(request, 2) == []  # slots 6 and 7 fit in block 2
    request.num_computed_tokens = 8
    assert kv.allocate_slots(request, 1) == [3]
    assert request.block_ids == [1, 2, 3] and kv.pool.num_free_blocks == 6
    kv.free(request)
    assert request.block_ids == [] and kv.pool.num_free_blocks == 9
