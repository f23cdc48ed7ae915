"""The garbage collector of a long-running llmserve process: once it is ready to serve, what
start-up built (modules, the model, the tokenizer, captured graphs, the servers) is moved out of
the collector's generations (gc.freeze), so a full collection no longer walks it.

Measured in the API process under W3 against the fake executor (docs/benchmarks.md, Runs W):
full collections held its event loop for 28-42 ms at a time (every stream stalls, and grpc.aio
accepts no new RPC meanwhile); frozen, its longest turns were 8-12 ms. vLLM freezes its heap
after start-up for the same reason. Garbage made later is collected as usual.
"""

from __future__ import annotations

import gc
import logging


def freeze_startup_heap(log: logging.Logger, full_collect: bool = True) -> None:
    """Collects once, then freezes every object alive now; logs how many.

    full_collect=False collects the young generations only (0 and 1: milliseconds), for a process
    whose event loop is already answering: a full collection holds the GIL, hence every thread
    and the loop, for as long as it walks the heap (0.37 s over 6 M objects here), and an API
    server answering health while it starts must not go silent that long
    (tests/integration/test_tokenizer_off_loop.py caught it in a pytest worker's large heap).
    The old generation's start-up garbage, if any, is frozen with the rest: a bounded, one-time
    cost."""
    gc.collect() if full_collect else gc.collect(1)
    gc.freeze()
    log.info("start-up heap frozen: %d objects out of the garbage collector's reach", gc.get_freeze_count())
