"""Process plumbing shared by the scheduler's two processes: the event loop and log format."""

from __future__ import annotations

import asyncio
import logging
import os


def run_async(main):
    """Runs a coroutine under uvloop when it is installed, plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def configure_logging(level: str, process: str) -> None:
    """One format for every llmserve process ("scheduler", "engine-core"; executor_svc/server.py
    writes the same with "executor"): time, process[pid], level, logger: message."""
    logging.basicConfig(level=level.upper(),
                        format=f"%(asctime)s {process}[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
