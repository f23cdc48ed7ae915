"""The one plan stream the executor serves at a time.

Two Execute streams would interleave plans over the same request rows and KV blocks, so a
second stream is refused while one is open. A Reset takes the slot over instead: it ends the
open stream (its handler task is cancelled and its client gets ABORTED), waits until that
stream has let go, then holds the slot itself while it clears the rows. That is how a
scheduler that reconnects after a hiccup gets in even when its old stream has not yet been
noticed as gone here (a half-open connection can linger for hours).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Lease:
    """The slot, held by one handler task (an Execute stream or a Reset)."""

    task: asyncio.Task
    released: asyncio.Event = field(default_factory=asyncio.Event)
    taken_over: bool = False  # a Reset cancelled this holder's task


class StreamSlot:
    """One holder at a time. Lives on the server's event loop (no threads touch it)."""

    def __init__(self, take_over_timeout_s: float = 10.0):
        self._lease: Lease | None = None
        self._take_over_timeout_s = take_over_timeout_s
        self._resets = asyncio.Lock()  # Resets take over one after another

    @property
    def is_held(self) -> bool:
        return self._lease is not None

    def try_acquire(self) -> Lease | None:
        """The slot for the calling task, or None while another holder has it."""
        if self._lease is not None:
            return None
        self._lease = Lease(asyncio.current_task())
        return self._lease

    def release(self, lease: Lease) -> None:
        if self._lease is lease:
            self._lease = None
        lease.released.set()

    @contextlib.asynccontextmanager
    async def taken_over(self) -> AsyncIterator[None]:
        """Ends whichever stream holds the slot and holds it for the calling task until the
        block exits. Raises TimeoutError if a stream does not let go in time."""
        async with self._resets:  # so the holder in the way is always a stream, never a Reset
            while (lease := self.try_acquire()) is None:
                holder = self._lease
                holder.taken_over = True
                holder.task.cancel()
                await asyncio.wait_for(holder.released.wait(), self._take_over_timeout_s)
            try:
                yield
            finally:
                self.release(lease)
