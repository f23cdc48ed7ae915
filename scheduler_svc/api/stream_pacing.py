"""How the API process's streams share its one event loop: fewer, larger messages when it falls
behind, and the folding of outputs queued for one stream.

Why pace (docs/scheduler.md, "Stream pacing"): every message a stream writes costs this
process's loop tens of microseconds (a protobuf, a grpc write, a syscall), and grpc.aio accepts
one new RPC per loop turn (it keeps one request_call outstanding). Hundreds of streams writing
every token keep the loop saturated: each turn runs hundreds of writes, and a burst of new
requests trickles in one per turn. Measured on W3 against a 1.5 ms fake executor (512 requests,
256 running): the requests took ~2 s to get in, the run ~940 steps instead of ~270.

The Pacer measures the loop's lag (how late a 5 ms sleep wakes) while streams exist. While the
lag exceeds LAG_LIMIT_S, the pacing gap doubles (up to --stream-pacing-ms); while it does not,
the gap halves down to zero. A stream writes at most one message a gap: the outputs it gets in
between are held by the engine client's fan-out (its RPC is not even woken for them) and fold
into its next message; its last output is never held. An idle loop (W1, a few streams) has no
lag and no gap: every token goes out as soon as it comes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.messages import RequestError

PERIOD_S = 0.005  # how often the lag is measured (while streams exist)
LAG_LIMIT_S = 0.001  # a loop this late is falling behind: the gap grows
MIN_GAP_S = 0.0005  # a gap halving below this is zero


class Pacer:
    """The pacing gap (seconds) every stream of this process keeps between its messages."""

    def __init__(self, max_gap_s: float, lag_limit_s: float = LAG_LIMIT_S):
        self.gap = 0.0
        self.max_gap = max_gap_s
        self._lag_limit = lag_limit_s
        self._streams_exist = asyncio.Event()

    def observe(self, lag: float) -> None:
        """One lag measurement: the gap doubles (plus 1 ms) past the lag limit, else halves."""
        if lag > self._lag_limit:
            self.gap = min(2 * self.gap + 0.001, self.max_gap)
        else:
            self.gap = self.gap / 2 if self.gap > MIN_GAP_S else 0.0

    def streams_started(self) -> None:
        self._streams_exist.set()

    async def run(self, has_streams: Callable[[], bool]) -> None:
        """Measures the loop's lag every PERIOD_S while has_streams(); sleeps without waking
        otherwise (the gap is then zero)."""
        loop = asyncio.get_running_loop()
        while True:
            if not has_streams():
                self.gap = 0.0
                self._streams_exist.clear()
                await self._streams_exist.wait()
            start = loop.time()
            await asyncio.sleep(PERIOD_S)
            self.observe(loop.time() - start - PERIOD_S)


def fold(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """One output carrying both (of one sample): the later one's state, both ones' tokens,
    text and logprobs (still aligned with the tokens), the earlier one's prompt logprobs."""
    later.new_token_ids = earlier.new_token_ids + later.new_token_ids
    later.new_text = earlier.new_text + later.new_text
    if earlier.logprobs is not None:
        later.logprobs = earlier.logprobs + (later.logprobs or [])
    if earlier.prompt_logprobs is not None:
        later.prompt_logprobs = earlier.prompt_logprobs
    return later


def merge_ready(item, queue: asyncio.Queue) -> list[RequestOutput] | RequestError:
    """Folds outputs already queued behind `item` into one per sample, in the order the
    samples first appear: when the stream falls behind the steps, the client gets fewer,
    larger messages instead of a growing backlog. A queued error wins."""
    if isinstance(item, RequestError):
        return item
    merged = {item.req_id: item}
    while not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, RequestError):
            return nxt
        earlier = merged.get(nxt.req_id)
        merged[nxt.req_id] = nxt if earlier is None else fold(earlier, nxt)
    return list(merged.values())
