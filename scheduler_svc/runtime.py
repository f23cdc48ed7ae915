"""Process plumbing shared by the scheduler's two processes: the event loop (the log format is
llmserve/logs.py, every llmserve process's)."""

from __future__ import annotations

import asyncio


def run_async(main):
    """Runs a coroutine under uvloop when it is installed, plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)

