"""No request can stop the engine core: an EngineCore in this process, driven through a socketpair
Channel as the API process drives it, over the fake executor. A request that makes adding it,
applying its tokens or encoding its output raise fails alone (INTERNAL) while another request
completes token-exact; a fault of the scheduler's own state fails every request and a fresh
scheduler serves the next one."""

import asyncio
import socket

import pytest
import uvloop

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.core.detokenizer import detokenizer_factory
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.engine import core_process
from scheduler_svc.engine.core_process import EngineCore
from scheduler_svc.engine.step_loop import StepLoop
from scheduler_svc.messages import ALL, AddRequest, decode_output
from scheduler_svc.pipe import Channel
from tests.scheduler.sched_driver import FakeExecutor, FakeTransport, make_config, reference_tokens

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_random_model  # imports torch: fine in tests

    return Tokenizer(build_random_model(tmp_path_factory.mktemp("model"), "tiny-llama"))


def _install_scheduler(core: EngineCore, detokenizers) -> None:
    """What EngineCore._connect does, over the fake executor instead of gRPC."""
    core.scheduler = Scheduler(make_config(), detokenizers, clock=lambda: 0.0)
    core.loop = StepLoop(core.scheduler, FakeTransport(FakeExecutor(4)), 2, on_outputs=core._publish)
    core._connected = core.stats.executor_available = True


class _Failing:
    """A detokenizer that raises on its `at`-th token."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.n = inner, at, 0

    def step(self, token_id: int) -> str:
        self.n += 1
        if self.n == self.at:
            raise RuntimeError("detokenizer exploded")
        return self.inner.step(token_id)

    def flush(self) -> str:
        return self.inner.flush()


def _start(core: EngineCore) -> list[asyncio.Task]:
    """The core's two tasks, as _core_main runs them (serve() runs run() after the handshake)."""
    return [asyncio.create_task(core.run()), asyncio.create_task(core.read_commands())]


async def _collect(theirs: Channel, tasks, adds: list[AddRequest], until: set[int]):
    """Sends the adds; collects {req_id: tokens} and {req_id: error} until every id in `until`
    has finished or failed; the core's tasks are still running then (it survived)."""
    for add in adds:
        await theirs.send(add)
    tokens, errors, done = {}, {}, set()
    while not until <= done:
        msg = await asyncio.wait_for(theirs.recv(), 10)
        for t in msg.outputs:
            out = decode_output(t)
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)
            if out.finished:
                done.add(out.req_id)
        for req_id, error in msg.errors:
            errors[req_id] = error
            done.add(req_id)
    assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
    return tokens, errors


async def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return await Channel.open(a, 1 << 20), await Channel.open(b, 1 << 20)


def test_a_request_that_makes_the_core_raise_fails_alone(tok, monkeypatch):
    real = core_process.encode_output

    def encode(o):  # request 4's output does not encode
        if o.req_id == 4:
            raise ValueError("cannot encode this")
        return real(o)

    monkeypatch.setattr(core_process, "encode_output", encode)
    factory = detokenizer_factory(tok)

    def detokenizers(request):
        inner = factory(request)  # the real one: it raises on a negative prompt id (request 2)
        return _Failing(inner, at=3) if request.req_id == 3 else inner

    async def main():
        ours, theirs = await _pair()
        core = EngineCore(SchedulerConfig(), ours)
        _install_scheduler(core, detokenizers)
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        adds = [AddRequest(1, PROMPT, params), AddRequest(2, [5, -1, 7], params),
                AddRequest(3, PROMPT, params), AddRequest(4, PROMPT, params)]
        tasks = _start(core)
        tokens, errors = await _collect(theirs, tasks, adds, until={1, 2, 3, 4})
        for t in tasks:
            t.cancel()
        return core, tokens, errors

    core, tokens, errors = uvloop.run(main())
    assert tokens[1] == reference_tokens(PROMPT, 12) and 1 not in errors
    assert {i: errors[i].code for i in (2, 3, 4)} == {2: "INTERNAL", 3: "INTERNAL", 4: "INTERNAL"}
    assert "while adding it" in errors[2].message and "TypeError" in errors[2].message
    assert "applying a step's token" in errors[3].message and "detokenizer exploded" in errors[3].message
    assert "encoding its output" in errors[4].message
    assert len(tokens.get(3, [])) == 2  # what it streamed before its third token raised
    sched = core.scheduler
    assert not sched.requests and sched.num_free_blocks == sched.num_total_blocks  # all freed


def test_a_fault_of_the_scheduler_itself_fails_every_request_and_a_fresh_one_serves(tok):
    async def main():
        ours, theirs = await _pair()
        core = EngineCore(SchedulerConfig(), ours)
        _install_scheduler(core, detokenizer_factory(tok))
        broken = core.scheduler

        def schedule():
            raise RuntimeError("the block pool is out of step")

        broken.schedule = schedule

        async def reconnect():  # what a real reconnect does: Handshake, Reset, a fresh scheduler
            _install_scheduler(core, detokenizer_factory(tok))
            core._publish()

        core.reconnect = reconnect
        params = SamplingParams(max_tokens=6, ignore_eos=True)
        tasks = _start(core)
        _, errors = await _collect(theirs, tasks, [AddRequest(1, PROMPT, params)], until={ALL})
        tokens, later_errors = await _collect(theirs, tasks, [AddRequest(2, PROMPT, params)], until={2})
        for t in tasks:
            t.cancel()
        return errors, tokens, later_errors, core.scheduler is not broken

    errors, tokens, later_errors, fresh = uvloop.run(main())
    assert errors[ALL].code == "INTERNAL" and "out of step" in errors[ALL].message
    assert fresh and tokens[2] == reference_tokens(PROMPT, 6) and not later_errors
