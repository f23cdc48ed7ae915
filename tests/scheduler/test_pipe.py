"""The channel between the scheduler's two processes (scheduler_svc/pipe.py): whole frames of
any size, one bad message fails alone, a stalled reader holds the writer back within its buffer;
and the engine core's publishing over it (an output batch too large to cross fails no one
but the request that cannot)."""

import asyncio
import socket
import time

import pytest
import uvloop

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.engine.core_process import EngineCore
from scheduler_svc.messages import decode_output
from scheduler_svc.pipe import (Channel, ChannelBroken, ChannelClosed, FrameTooLarge,
                                UndeliverableMessage)
from tests.scheduler.sched_driver import LetterDetokenizer, make_config, req

LOOPS = {"asyncio": asyncio.run, "uvloop": uvloop.run}  # the services run under uvloop


async def _pair(max_frame_bytes: int, buffer_bytes: int = 1 << 20) -> tuple[Channel, Channel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return (await Channel.open(a, max_frame_bytes, buffer_bytes),
            await Channel.open(b, max_frame_bytes, buffer_bytes))


@pytest.mark.parametrize("loop", LOOPS)
def test_a_huge_message_crosses_whole_and_framing_holds(loop):
    async def main():
        writer, reader = await _pair(max_frame_bytes=64 << 20)
        huge = {"stop": ("x" * 1024,) * 8192, "ids": list(range(500_000))}  # ~12 MiB pickled
        receiving = asyncio.create_task(reader.recv())
        await writer.send(huge)
        await writer.send("after")
        assert await receiving == huge
        assert await reader.recv() == "after"

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_message_over_the_limit_or_unpicklable_fails_alone(loop):
    async def main():
        writer, reader = await _pair(max_frame_bytes=4096)
        with pytest.raises(FrameTooLarge, match=r"over the 4096-byte limit .*--max-pipe-frame-bytes"):
            await writer.send("x" * 5000)
        with pytest.raises(UndeliverableMessage, match="cannot be pickled"):
            writer.send_nowait(lambda: None)
        await writer.send(("still", "framed"))
        assert await reader.recv() == ("still", "framed")

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stalled_reader_holds_the_writer_back_and_loses_nothing(loop):
    buffer_bytes, frame = 256 << 10, b"m" * (16 << 10)
    num_messages = 600  # ~9.6 MiB: far more than every buffer on the way together

    async def main():
        writer, reader = await _pair(max_frame_bytes=1 << 20, buffer_bytes=buffer_bytes)
        sent, most_buffered = 0, 0

        async def write():
            nonlocal sent, most_buffered
            for i in range(num_messages):
                await writer.send((i, frame))
                sent += 1
                most_buffered = max(most_buffered, writer.num_buffered_bytes)

        writing = asyncio.create_task(write())
        await asyncio.sleep(2.0)  # the reader stalls; the writer keeps sending
        sent_while_stalled = sent
        assert not writing.done()
        received = []
        while len(received) < num_messages:
            received.append(await reader.recv())
        await writing  # nothing raised
        return sent_while_stalled, most_buffered, received

    sent_while_stalled, most_buffered, received = LOOPS[loop](main())
    assert [i for i, _ in received] == list(range(num_messages))
    assert all(payload == frame for _, payload in received)
    # Only the buffers on the way (writer's transport, two kernel socket buffers, the reader's
    # stream buffer) filled; the writer's own buffer never held more than its limit + a frame.
    assert most_buffered <= buffer_bytes + len(frame) + 64
    assert sent_while_stalled * len(frame) < 4 * (1 << 20)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_reader_sees_the_writer_close_and_a_bad_frame(loop):
    async def main():
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader = await Channel.open(b, max_frame_bytes=1024)
        a.sendall((1 << 20).to_bytes(4, "big"))  # a header announcing more than the limit
        with pytest.raises(ChannelBroken, match="over the 1024-byte limit"):
            await reader.recv()
        writer, reader = await _pair(max_frame_bytes=1024)
        await writer.send(1)
        await writer.aclose()
        assert await reader.recv() == 1
        with pytest.raises(ChannelClosed):
            await reader.recv()
        a.close()

    LOOPS[loop](main())


def test_an_output_batch_too_large_to_cross_fails_only_the_request_that_cannot():
    async def main():
        ours, theirs = await _pair(max_frame_bytes=2048)
        core = EngineCore(SchedulerConfig(), ours)
        core.scheduler = Scheduler(make_config(), lambda request: LetterDetokenizer())
        for req_id in (1, 2, 3):
            core.scheduler.add_request(req(req_id, [1, 2, 3], max_tokens=8))
        small = [RequestOutput(i, [5], "abcdefgh" * 20, None, "", 3, 1) for i in (1, 2)]  # ~1.5 KiB together
        huge = RequestOutput(3, [6], "x" * 4000, None, "", 3, 1)
        core._publish(small + [huge])
        messages = [await theirs.recv() for _ in range(3)]
        return messages, core.scheduler

    messages, scheduler = uvloop.run(main())
    delivered = [decode_output(t) for m in messages for t in m.outputs]
    assert [(o.req_id, o.new_text) for o in delivered] == [(1, "abcdefgh" * 20), (2, "abcdefgh" * 20)]
    (req_id, error), = [e for m in messages for e in m.errors]
    assert (req_id, error.code) == (3, "RESOURCE_EXHAUSTED")
    assert "2048-byte limit" in error.message
    assert 3 not in scheduler.requests and {1, 2} <= set(scheduler.requests)  # aborted alone


def test_send_never_waits_while_the_reader_keeps_up():
    async def main():
        writer, reader = await _pair(max_frame_bytes=1 << 20, buffer_bytes=64 << 10)
        received = []

        async def read():
            while len(received) < 2000:
                received.append(await reader.recv())

        reading = asyncio.create_task(read())
        t0 = time.perf_counter()
        for i in range(2000):
            await writer.send(i)
        await reading
        return time.perf_counter() - t0, received

    elapsed, received = uvloop.run(main())
    assert received == list(range(2000)) and elapsed < 5
