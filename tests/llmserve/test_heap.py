"""freeze_startup_heap: what is alive at the call leaves the collector's generations (a full
collection no longer walks it); garbage made afterwards is still collected."""

import gc
import logging
import weakref


class _Node:
    pass


def test_the_startup_heap_is_frozen_and_later_cycles_are_still_collected(caplog):
    from llmserve.heap import freeze_startup_heap

    kept = [_Node() for _ in range(1000)]
    try:
        with caplog.at_level(logging.INFO):
            freeze_startup_heap(logging.getLogger("test"))
        assert gc.get_freeze_count() >= len(kept)
        tracked = {id(o) for o in gc.get_objects()}  # what a full collection walks
        assert not any(id(k) in tracked for k in kept)
        assert "start-up heap frozen" in caplog.text
        cycle = _Node()
        cycle.self = cycle  # garbage made after the freeze, reachable only from itself
        ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_a_young_only_freeze_leaves_no_young_garbage_and_freezes_the_rest():
    from llmserve.heap import freeze_startup_heap

    kept = [_Node() for _ in range(1000)]
    young = _Node()
    young.self = young  # cyclic garbage of the young generations: collected, not frozen
    ref = weakref.ref(young)
    del young
    try:
        freeze_startup_heap(logging.getLogger("test"), full_collect=False)
        assert ref() is None
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(k) in tracked for k in kept)
    finally:
        gc.unfreeze()
