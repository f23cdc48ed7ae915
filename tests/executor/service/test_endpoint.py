"""The gRPC endpoint process (service/endpoint.py) as a real child, the test playing the device
process on the link: no torch in it; a handshake only while the device sends alive frames; plans
and results cross as the bytes they are; at most 8 plans unanswered; results of a stream that
has ended (cancelled, or taken over by Reset) never reach the next one; it exits at the link's
end and on a stop frame."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

import grpc
import pytest

from executor_svc.config import ExecutorConfig
from executor_svc.service import link
from executor_svc.service.endpoint import EndpointProcess
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from tests.executor.service.test_server import AUTH, TOKEN, PlanFeed, decode

INFO = pb.ExecutorInfo(model_name="fake", vocab_size=77, num_blocks=5)


class FakeDevice:
    """The device process's side of a started endpoint: frames read on a thread into a queue."""

    def __init__(self):
        self.endpoint = EndpointProcess.start(ExecutorConfig(port=0, internal_token=TOKEN), INFO.SerializeToString())
        self.port = self.endpoint.wait_ready()
        self.frames: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.ExecutorStub(self.channel)

    def _read(self) -> None:
        try:
            while True:
                self.frames.put(self.endpoint.link.recv())
        except (EOFError, OSError):
            self.frames.put(None)

    def frame(self, timeout: float = 10) -> link.Frame:
        return self.frames.get(timeout=timeout)

    def answer(self, epoch: int, step_id: int) -> None:
        self.endpoint.link.send(link.RESULT, epoch, pb.StepResult(step_id=step_id, req_ids=[step_id]).SerializeToString())

    def close(self) -> None:
        self.channel.close()
        self.endpoint.link.close()
        self.endpoint.wait(10)


@pytest.fixture
def device():
    device = FakeDevice()
    yield device
    device.close()


def maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_the_endpoint_imports_no_torch():
    check = ("import sys; import executor_svc.service.endpoint, executor_svc.service.servicer, grpc_health.v1.health, "
             "protos.reflection, llmserve.bearer_auth; "
             "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'executor_svc.worker', "
             "'executor_svc.models', 'executor_svc.sample', 'executor_svc.startup'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_running_endpoint_has_no_torch_mapped(device):
    import torch  # noqa: F401 - this process has it: the check below can fail

    assert "libtorch" in maps(os.getpid())
    assert "libtorch" not in maps(device.endpoint.proc.pid)


def test_a_handshake_is_answered_only_while_the_device_is_alive(device):
    with pytest.raises(grpc.RpcError) as silent:  # no alive frame yet: a stopped device process
        device.stub.Handshake(pb.HandshakeRequest(), metadata=AUTH, timeout=0.5)
    assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    waiting = device.stub.Handshake.future(pb.HandshakeRequest(), metadata=AUTH, timeout=10)
    time.sleep(0.2)
    assert not waiting.done()
    device.endpoint.link.send(link.ALIVE)
    assert waiting.result() == INFO
    assert device.stub.Handshake(pb.HandshakeRequest(), metadata=AUTH, timeout=10) == INFO  # fresh
    time.sleep(2 * link.STALE_S)
    with pytest.raises(grpc.RpcError) as silent:  # stale again
        device.stub.Handshake(pb.HandshakeRequest(), metadata=AUTH, timeout=0.5)
    assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_plans_and_results_cross_as_their_bytes(device):
    device.endpoint.link.send(link.ALIVE)
    assert device.stub.Handshake(pb.HandshakeRequest(), metadata=AUTH) == INFO
    feed = PlanFeed()
    stream = device.stub.Execute(feed, metadata=AUTH)
    sent = decode(7, 1, 2)
    before = time.monotonic_ns()
    feed.plans.put(sent)
    frame = device.frame()
    assert frame.kind == link.PLAN and frame.body == sent.SerializeToString()
    assert before <= frame.stamp <= time.monotonic_ns()  # when the endpoint read it
    device.answer(frame.tag, 7)
    assert next(stream) == pb.StepResult(step_id=7, req_ids=[7])
    feed.plans.put(None)
    assert list(stream) == []


def test_at_most_eight_plans_unanswered(device):
    stream = device.stub.Execute(iter([decode(i, 1) for i in range(20)]), metadata=AUTH)
    frames = [device.frame() for _ in range(8)]
    time.sleep(0.5)
    assert device.frames.empty()  # the ninth waits for an answer
    device.answer(frames[0].tag, 0)
    frames.append(device.frame())
    time.sleep(0.2)
    assert device.frames.empty()
    for i in range(1, 20):
        if i >= 9:
            frames.append(device.frame())
        device.answer(frames[i].tag, i)
    assert [r.step_id for r in stream] == list(range(20))
    assert [pb.StepPlan.FromString(f.body).step_id for f in frames] == list(range(20))


def test_results_of_an_ended_stream_never_reach_the_next(device):
    # a stream taken over by Reset: its late results come before the reset's answer, and go nowhere
    feed = PlanFeed()
    old = device.stub.Execute(feed, metadata=AUTH)
    feed.plans.put(decode(1, 1))
    feed.plans.put(decode(2, 1))
    old_epoch = device.frame().tag
    assert device.frame().tag == old_epoch
    reset = threading.Thread(target=device.stub.Reset, args=(pb.ResetRequest(),), kwargs={"metadata": AUTH})
    reset.start()
    frame = device.frame()
    assert frame.kind == link.RESET
    with pytest.raises(grpc.RpcError) as ended:
        next(old)
    assert ended.value.code() == grpc.StatusCode.ABORTED
    feed.plans.put(None)
    device.answer(old_epoch, 1)
    device.answer(old_epoch, 2)
    device.endpoint.link.send(link.RESET_DONE, frame.tag)
    reset.join(10)
    assert not reset.is_alive()
    # a cancelled stream: its results come after the next stream has opened
    feed = PlanFeed()
    cancelled = device.stub.Execute(feed, metadata=AUTH)
    feed.plans.put(decode(3, 1))
    cancelled_epoch = device.frame().tag
    cancelled.cancel()
    feed.plans.put(None)
    _wait_until_the_slot_is_free(device.stub)
    feed = PlanFeed()
    new = device.stub.Execute(feed, metadata=AUTH)
    feed.plans.put(decode(4, 1))
    new_epoch = device.frame().tag
    assert len({old_epoch, cancelled_epoch, new_epoch}) == 3
    device.answer(cancelled_epoch, 3)
    device.answer(new_epoch, 4)
    assert next(new).step_id == 4
    feed.plans.put(None)
    assert list(new) == []


def _wait_until_the_slot_is_free(stub) -> None:
    """An empty stream is refused (FAILED_PRECONDITION) until the cancelled one has let go."""
    deadline = time.monotonic() + 5
    while True:
        try:
            assert list(stub.Execute(iter([]), metadata=AUTH)) == []
            return
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and time.monotonic() < deadline
            time.sleep(0.05)


def test_it_exits_when_the_link_ends_or_on_a_stop_frame():
    for stop in (True, False):
        device = FakeDevice()
        if stop:
            device.endpoint.stop(0.1)
        else:
            device.endpoint.link.close()  # as when the device process dies
        assert device.endpoint.proc.wait(5) == 0
        assert device.frame() is None  # it closed its end
        with pytest.raises(grpc.RpcError) as refused:
            device.stub.Handshake(pb.HandshakeRequest(), metadata=AUTH, timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        device.close()
