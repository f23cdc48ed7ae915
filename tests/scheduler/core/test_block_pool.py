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
    h1 = hash_block_tokens(-1, (1, 2))
    assert hash_block_tokens(h1, (3, 4)) != hash_block_tokens(hash_block_tokens(-1, (9, 9)), (3, 4))
    assert hash_block_tokens(h1, (3, 4)) == hash_block_tokens(hash_block_tokens(-1, (1, 2)), (3, 4))


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
