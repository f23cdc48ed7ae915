"""The channel between the scheduler's two processes: framed, bounded, asyncio on both sides.

A frame is a 4-byte big-endian length and that many bytes of pickle (both ends are our own
processes, started together from one install). Over a connected Unix stream socket:

- **Framed**: a message arrives whole or not at all, whatever its size; a message that cannot
  be framed (larger than `max_frame_bytes`, or that fails to pickle) raises
  `UndeliverableMessage` at the sender and leaves the channel usable.
- **Back-pressured**: bytes the peer has not read wait in the kernel socket buffer, then in the
  transport's buffer; once that holds `buffer_bytes`, `send()` and `drain()` wait until the
  peer reads. A sender's memory is bounded by `buffer_bytes` plus one frame; nothing raises
  because the reader is slow.
- **Asyncio-native**: asyncio streams, no blocking call on the loop.

`send_nowait()` writes without waiting, for the few messages that must not wait (an abort, a
reply written by a reader task): a task that reads must never wait for its own writes, or two
processes that both stall writing would stop reading each other.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

HEADER = struct.Struct("!I")  # the payload's length in bytes
DEFAULT_BUFFER_BYTES = 1 << 20
_JOIN_BELOW_BYTES = 64 << 10


class UndeliverableMessage(Exception):
    """This one message cannot cross (it does not pickle); the channel is intact."""


class FrameTooLarge(UndeliverableMessage):
    """This one message is larger than the channel's max_frame_bytes; the channel is intact."""


class ChannelClosed(EOFError):
    """The peer closed the channel (its process exited or closed its end)."""


class ChannelBroken(Exception):
    """The peer sent something that is not a frame of this protocol; the channel is unusable."""


class Channel:
    """One end of a framed message channel over a connected stream socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_frame_bytes: int):
        self._reader = reader
        self._writer = writer
        self.max_frame_bytes = max_frame_bytes
        self._send_lock = asyncio.Lock()  # one waiting sender at a time keeps the bound

    @classmethod
    async def open(cls, sock: socket.socket, max_frame_bytes: int,
                   buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> Channel:
        """Wraps a connected socket (call inside the loop that will use the channel)."""
        # The reader pauses the socket once it holds 2 * limit unread bytes (one larger
        # frame is still read whole): the receiving side is bounded too.
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=buffer_bytes // 2)
        writer.transport.set_write_buffer_limits(high=buffer_bytes, low=buffer_bytes // 4)
        return cls(reader, writer, max_frame_bytes)

    def _encode(self, message: object) -> bytes:
        """The frame's payload; raises UndeliverableMessage naming the limit."""
        try:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - any pickling failure concerns this message only
            raise UndeliverableMessage(f"{type(message).__name__} cannot be pickled: {e}") from e
        if len(payload) > self.max_frame_bytes:
            raise FrameTooLarge(
                f"{type(message).__name__} is {len(payload)} bytes encoded, over the "
                f"{self.max_frame_bytes}-byte limit between the scheduler's processes "
                "(--max-pipe-frame-bytes)")
        return payload

    def send_nowait(self, message: object) -> None:
        """Queues one frame without waiting (see the module docstring for when)."""
        payload = self._encode(message)
        if self._writer.transport.is_closing():
            raise ChannelClosed("the channel is closed")
        # write(), not writelines(): 3.12's selector transport does not pause the protocol
        # in writelines, which would leave drain() never waiting.
        header = HEADER.pack(len(payload))
        if len(payload) < _JOIN_BELOW_BYTES:
            self._writer.write(header + payload)  # one syscall for the many small frames
        else:
            self._writer.write(header)
            self._writer.write(payload)  # no copy of a large payload

    async def send(self, message: object) -> None:
        """Sends one frame; waits while the peer is `buffer_bytes` behind."""
        async with self._send_lock:
            self.send_nowait(message)
            await self._drain()

    async def drain(self) -> None:
        """Waits until the bytes not yet read by the peer are below the buffer limit."""
        async with self._send_lock:
            await self._drain()

    async def _drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError as e:
            raise ChannelClosed(f"the channel broke: {e}") from e

    @property
    def num_buffered_bytes(self) -> int:
        """Bytes written here that are not yet in the kernel's socket buffer."""
        return self._writer.transport.get_write_buffer_size()

    async def recv(self) -> object:
        """The next message; ChannelClosed at the peer's end, ChannelBroken on a bad frame."""
        try:
            (length,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
            if length > self.max_frame_bytes:
                raise ChannelBroken(f"a {length}-byte frame, over the {self.max_frame_bytes}-byte limit")
            payload = await self._reader.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise ChannelClosed("the other process closed the channel") from e
        except ConnectionError as e:
            raise ChannelClosed(f"the channel broke: {e}") from e
        try:
            return pickle.loads(payload)
        except Exception as e:  # noqa: BLE001 - both ends are ours: a bad payload is a broken peer
            raise ChannelBroken(f"a frame did not unpickle: {e}") from e

    def close(self) -> None:
        """Closes this end; the peer's recv() raises ChannelClosed once it has read the rest."""
        self._writer.close()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Closes this end after flushing what is written (for at most `timeout` seconds)."""
        self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass
