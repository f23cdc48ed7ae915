"""EngineClient's side of parallel sampling: one AddRequest for n samples, their outputs merged
into one stream with each sample's index, folded per sample (logprobs aligned with tokens),
and every live sample aborted when the caller leaves early. The core is faked by feeding
outputs to the client as its reader would."""

import asyncio

import pytest

from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.stream_pacing import merge_ready as _merge_ready
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason, SamplingParams
from scheduler_svc.messages import AbortRequest, AddRequest, RequestError


class FakeChannel:
    def __init__(self):
        self.sent = []

    def send_nowait(self, msg):
        self.sent.append(msg)

    async def drain(self):
        pass


def client(**config) -> tuple[EngineClient, FakeChannel]:
    c = EngineClient(SchedulerConfig(**config))
    c._channel = FakeChannel()
    return c, c._channel


def out(req_id, token, finished=False, logprob=None, prompt=None):
    return RequestOutput(req_id, [token], chr(ord("a") + token), FinishReason.LENGTH if finished else None,
                         "", 3, 1, None if logprob is None else [(token, logprob, 1, [], [])], prompt)


async def _take(agen, num):
    return [await agen.__anext__() for _ in range(num)]


def test_n_samples_share_one_add_and_stream_with_their_index():
    async def main():
        c, ch = client()
        gen = c.generate([1, 2, 3], SamplingParams(max_tokens=2, n=2))
        first = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        (add,) = ch.sent
        assert isinstance(add, AddRequest) and add.req_id == 1 and c.num_requests == 2
        c._deliver(2, out(2, 5, logprob=-0.5))
        c._deliver(1, out(1, 4, logprob=-0.25, prompt=[(1, None, 0, [], [])]))
        c._deliver(2, out(2, 6, finished=True, logprob=-1.0))  # folded with its earlier output
        msg = await first
        rest = await _take(gen, 1)
        got = [(m.index, m.new_token_ids, m.new_text, m.logprobs and [e[1] for e in m.logprobs],
                m.prompt_logprobs is not None, m.finished) for m in [msg] + rest]
        assert got == [(1, [5, 6], "fg", [-0.5, -1.0], False, True), (0, [4], "e", [-0.25], True, False)]
        c._deliver(1, out(1, 7, finished=True))
        (last,) = await _take(gen, 1)
        assert (last.index, last.finished) == (0, True)
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        assert c.num_requests == 0 and len(ch.sent) == 1  # all finished: nothing to abort
        # the next request's ids come after the samples'
        gen = c.generate([1], SamplingParams(max_tokens=1))
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        assert ch.sent[-1].req_id == 3
        task.cancel()
    asyncio.run(main())


def test_leaving_early_aborts_every_sample_still_running():
    async def main():
        c, ch = client()
        gen = c.generate([1, 2, 3], SamplingParams(max_tokens=5, n=3))
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        c._deliver(2, out(2, 5, finished=True))
        await task
        await gen.aclose()
        assert [m.req_id for m in ch.sent if isinstance(m, AbortRequest)] == [1, 3]
        assert c.num_requests == 0
    asyncio.run(main())


def test_an_error_of_one_sample_ends_the_call_and_aborts_the_others():
    async def main():
        c, ch = client()
        gen = c.generate([1, 2, 3], SamplingParams(max_tokens=5, n=2))
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        c._deliver(2, RequestError("INTERNAL", "boom"))
        with pytest.raises(RequestError):
            await task
        assert sorted(m.req_id for m in ch.sent if isinstance(m, AbortRequest)) == [1, 2]
    asyncio.run(main())


def test_stream_interval_holds_each_sample_on_its_own():
    async def main():
        c, _ = client(stream_interval=2)
        gen = c.generate([1], SamplingParams(max_tokens=4, n=2))
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        c._deliver(1, out(1, 4))
        c._deliver(2, out(2, 5))
        await asyncio.sleep(0)
        assert not task.done()  # one token each: below the interval
        c._deliver(2, out(2, 6))
        msg = await task
        assert (msg.index, msg.new_token_ids) == (1, [5, 6])
        await gen.aclose()
    asyncio.run(main())


def test_a_paced_stream_folds_its_tokens_until_the_gap_has_passed_and_never_holds_the_last():
    async def main():
        c, _ = client()
        gen = c.generate([1], SamplingParams(max_tokens=5))
        first = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        c._deliver(1, out(1, 1))
        assert (await first).new_token_ids == [1]  # no gap: written as it comes
        c.pacer.gap = 3600.0  # this process falls behind: one message an hour
        task = asyncio.ensure_future(gen.__anext__())
        for token in (2, 3):
            c._deliver(1, out(1, token))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert not task.done()  # held: the stream wrote less than a gap ago
        stream = c._streams[1]
        assert stream.queue.empty() and len(stream.held) == 2  # held back: its RPC not even woken
        c._deliver(1, out(1, 4, finished=True))  # the last message goes out at once
        msg = await task
        assert (msg.new_token_ids, msg.new_text, msg.finished) == ([2, 3, 4], "cde", True)
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
    asyncio.run(main())


def test_merge_ready_folds_per_sample_in_first_seen_order():
    q: asyncio.Queue = asyncio.Queue()
    for o in [out(2, 1, logprob=-1.0), out(1, 2), out(2, 3, logprob=-3.0)]:
        q.put_nowait(o)
    merged = _merge_ready(out(1, 0), q)
    assert [(m.req_id, m.new_token_ids, m.logprobs) for m in merged] == [
        (1, [0, 2], None), (2, [1, 3], [(1, -1.0, 1, [], []), (3, -3.0, 1, [], [])])]
    q.put_nowait(RequestError("INTERNAL", "x"))
    assert isinstance(_merge_ready(out(1, 0), q), RequestError)


def test_a_paced_stream_whose_client_stopped_reading_is_still_aborted():
    """Pacing holds outputs in the fan-out; a client stuck in a write (its RPC not reading)
    past the backlog is aborted as before, the held outputs dropped with it."""
    import time

    async def main():
        c, ch = client(max_stream_backlog=4)
        gen = c.generate([1], SamplingParams(max_tokens=100))
        first = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        c._deliver(1, out(1, 1))
        assert (await first).new_token_ids == [1]  # the RPC now "writes" it and reads no more
        c.pacer.gap = 3600.0
        stream = c._streams[1]
        stream.last_read = time.monotonic() - 5.0  # stuck in that write for 5 s
        for token in range(2, 12):
            c._deliver(1, out(1, token))
        assert stream.aborted and stream.held == []
        assert [m.req_id for m in ch.sent if isinstance(m, AbortRequest)] == [1]
        with pytest.raises(RequestError) as err:
            await gen.__anext__()
        assert err.value.code == "RESOURCE_EXHAUSTED" and "read too slowly" in err.value.message
    asyncio.run(main())
