"""The link between the executor's two processes: the device process (the model, the runner and
its two step threads: service/step_threads.py) and the gRPC endpoint process (service/endpoint.py).

One socketpair, made by the device process; the endpoint inherits its end. A frame is a fixed
17-byte header, then `length` bytes of body:

    length  u32  the body's size in bytes (at most MAX_BODY_BYTES)
    kind    u8   one of the letters below
    tag     u32  what the kind says: a stream's epoch, a reset's id, a port, a grace
    stamp   u64  plan frames: time.monotonic_ns() when the endpoint read the plan; else 0

    kind  sent by   tag            body
    S     device    0              start: JSON {host, port, token, reflection, info (base64 ExecutorInfo)}
    Y     endpoint  the bound port (none) ready: the server is up, health SERVING
    P     endpoint  stream epoch   a StepPlan's bytes, as the stream brought them
    R     device    stream epoch   a StepResult's bytes: one for each P, in P order
    Z     endpoint  reset id       (none) reset: every step launched before it is answered first
    D     device    reset id       reset done: "" or the error that reset() raised
    Q     device    grace in ms    (none) stop: health NOT_SERVING, stop the server, exit
    A     device    0              (none) alive: every HEARTBEAT_S, from the device's event loop

Each Execute stream gets a new epoch; the endpoint drops results of an epoch whose stream has
ended. A Handshake is answered only while the device process is alive: within STALE_S of its last
alive frame, or at its next one (a stopped or hung device process leaves the call to its deadline,
as it did when one process served both). End of file, either way, means the other process has exited (or closed its end). The
device process reads and writes with blocking calls (BlockingLink: a recv releases the GIL);
the endpoint with asyncio streams (read_frame, encode), never blocking its event loop.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import threading
from dataclasses import dataclass

HEADER = struct.Struct("!IBIQ")  # length, kind, tag, stamp
MAX_BODY_BYTES = (64 << 20) + (1 << 20)  # a plan or result as large as gRPC lets one be, and more

START, READY, PLAN, RESULT, RESET, RESET_DONE, STOP, ALIVE = (ord(k) for k in "SYPRZDQA")
HEARTBEAT_S = 0.1  # the device process's alive frames
STALE_S = 0.25  # a Handshake waits for the next alive frame when the last is older


class LinkBroken(Exception):
    """The other process sent something that is not a frame of this protocol."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    tag: int = 0
    body: bytes = b""
    stamp: int = 0


def encode(kind: int, tag: int = 0, body: bytes = b"", stamp: int = 0) -> bytes:
    """One frame's bytes."""
    return HEADER.pack(len(body), kind, tag, stamp) + body


def _frame(header: bytes) -> tuple[int, Frame]:
    length, kind, tag, stamp = HEADER.unpack(header)
    if length > MAX_BODY_BYTES:
        raise LinkBroken(f"a frame of {length} bytes, over the link's {MAX_BODY_BYTES}")
    return length, Frame(kind, tag, b"", stamp)


class BlockingLink:
    """The device process's end: recv() on one thread (the launch thread), send() on any."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._in = sock.makefile("rb")
        self._lock = threading.Lock()  # one frame's bytes at a time
        self.broken = False  # a send failed: the other process has gone

    def recv(self) -> Frame:
        """The next frame (blocks, without the GIL); EOFError when the other process has gone."""
        header = self._in.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("the link's other end has closed")
        length, frame = _frame(header)
        body = self._in.read(length) if length else b""
        if len(body) < length:
            raise EOFError("the link's other end closed within a frame")
        return Frame(frame.kind, frame.tag, body, frame.stamp)

    def send(self, kind: int, tag: int = 0, body: bytes = b"", stamp: int = 0) -> bool:
        """Sends one frame; False (and nothing raised) once the other process has gone."""
        data = encode(kind, tag, body, stamp)
        with self._lock:
            try:
                self._sock.sendall(data)
                return True
            except OSError:
                self.broken = True
                return False

    def send_nowait(self, kind: int, tag: int = 0, lock_s: float = 0.0) -> None:
        """Sends one bodiless frame unless that would wait: for another thread's send longer than
        `lock_s`, or for a full socket buffer (a stuck endpoint). The event loop's frames: alive, stop."""
        if not self._lock.acquire(timeout=lock_s):
            return
        try:
            if select.select([], [self._sock], [], 0)[1]:
                self._sock.sendall(encode(kind, tag))
        except OSError:
            self.broken = True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Ends the link both ways (a thread blocked in recv() gets EOFError), then frees it."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._in.close()
        self._sock.close()


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """The endpoint's next frame; EOFError when the device process has gone."""
    try:
        length, frame = _frame(await reader.readexactly(HEADER.size))
        body = await reader.readexactly(length) if length else b""
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise EOFError("the device process has closed the link") from e
    return Frame(frame.kind, frame.tag, body, frame.stamp)
