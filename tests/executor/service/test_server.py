"""The gRPC server end to end on loopback: health, handshake, an Execute stream, Reset; the
internal token, one plan stream at a time, Reset taking over, reflection only when asked."""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from executor_svc.config import ExecutorConfig
from executor_svc.service.server import serve
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from scheduler_svc.engine.executor_client import ExecutorClient, ExecutorUnavailable
from step_protocol import codec

TOKEN = "test-token-7f3a"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
GREEDY = pb.SamplerParams(temperature=0.0, top_p=1.0)


@contextlib.contextmanager
def running_server(config: ExecutorConfig):
    """serve(config) on its own loop in a thread; yields the address once serving."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    port: list[int] = []

    def on_ready(p: int) -> None:
        port.append(p)
        ready.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(config, on_ready, stop),), daemon=True)
    thread.start()
    assert ready.wait(60), "server did not start"
    try:
        yield f"127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        assert not thread.is_alive()


def _config(model_dirs, **kw) -> ExecutorConfig:
    return ExecutorConfig(model=str(model_dirs["tiny-qwen3"]), model_name="tiny", port=0, max_num_seqs=4,
                          max_num_batched_tokens=64, num_kv_blocks=32, max_model_len=256, **kw)


@pytest.fixture(scope="module")
def address(model_dirs):
    with running_server(_config(model_dirs, internal_token=TOKEN)) as address:
        yield address


@pytest.fixture
def stub(address):
    with grpc.insecure_channel(address) as channel:
        yield pb_grpc.ExecutorStub(channel)


def new_plan(step_id: int, req_id: int = 1, block: int = 1) -> pb.StepPlan:
    return pb.StepPlan(step_id=step_id, new_requests=[pb.NewRequest(
        req_id=req_id, token_ids=[5, 6, 7, 8], sampler_params=GREEDY, block_ids=[block], num_scheduled_tokens=4)])


def decode(step_id: int, *req_ids: int) -> pb.StepPlan:
    n = len(req_ids)
    return pb.StepPlan(step_id=step_id, cached_requests=pb.CachedRequests(
        req_ids=req_ids, num_scheduled_tokens=[1] * n, num_new_blocks=[0] * n))


class PlanFeed:
    """A request stream the test writes into; None ends it."""

    def __init__(self):
        self.plans: queue.Queue = queue.Queue()

    def __iter__(self):
        return self

    def __next__(self) -> pb.StepPlan:
        plan = self.plans.get()
        if plan is None:
            raise StopIteration
        return plan


def _code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


def test_health_and_handshake(address, stub):
    with grpc.insecure_channel(address) as channel:  # health needs no token
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    info = stub.Handshake(pb.HandshakeRequest(), metadata=AUTH)
    assert (info.model_name, info.vocab_size, list(info.eos_token_ids)) == ("tiny", 512, [1])
    assert (info.num_blocks, info.block_size, info.max_num_seqs, info.max_model_len) == (32, 16, 4, 256)
    assert info.device == "cpu" and info.dtype == "float32" and list(info.cuda_graph_sizes) == []


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),),
                                      (("authorization", TOKEN),), AUTH + AUTH],
                         ids=["none", "wrong", "no-bearer", "twice"])
def test_every_executor_rpc_needs_the_token(stub, metadata):
    kw = {} if metadata is None else {"metadata": metadata}
    assert _code(lambda: stub.Handshake(pb.HandshakeRequest(), **kw)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: stub.Reset(pb.ResetRequest(), **kw)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: list(stub.Execute(iter([new_plan(1)]), **kw))) == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as raised:
        stub.Handshake(pb.HandshakeRequest(), **kw)
    assert "internal token" in raised.value.details()


def test_execute_stream_in_order_and_errors_do_not_end_it(stub):
    bad_temperature = new_plan(3, req_id=2, block=2)
    bad_temperature.new_requests[0].sampler_params.temperature = math.nan
    plans = [new_plan(1), decode(2, 99), bad_temperature, decode(4, 1, 1), decode(5, 1)]
    results = list(stub.Execute(iter(plans), metadata=AUTH))
    stub.Reset(pb.ResetRequest(), metadata=AUTH)
    assert [r.step_id for r in results] == [1, 2, 3, 4, 5]
    assert list(results[0].req_ids) == [1] and results[0].error == ""
    # bad rows fail alone (the plan runs without them); a plan bad as a whole is an error
    assert list(results[1].failed_req_ids) == [99] and "cached request 99 is not running" in results[1].failed_errors[0]
    assert list(results[2].failed_req_ids) == [2] and "temperature nan" in results[2].failed_errors[0]
    assert not results[1].error and not results[2].error
    assert "request 1 is scheduled twice" in results[3].error
    assert list(results[4].req_ids) == [1] and results[4].graph_size == 0


def test_one_plan_stream_at_a_time_and_a_cancelled_one_frees_the_slot(stub):
    feed = PlanFeed()
    first = stub.Execute(feed, metadata=AUTH)
    feed.plans.put(new_plan(1))
    assert next(first).error == ""  # the first stream is open
    second = _code(lambda: list(stub.Execute(iter([decode(2, 1)]), metadata=AUTH)))
    assert second == grpc.StatusCode.FAILED_PRECONDITION
    feed.plans.put(None)
    assert list(first) == []  # the first stream ends normally: the slot is free again
    assert list(stub.Execute(iter([decode(2, 1)]), metadata=AUTH))[0].error == ""

    feed = PlanFeed()
    third = stub.Execute(feed, metadata=AUTH)
    feed.plans.put(decode(3, 1))
    assert next(third).error == ""
    third.cancel()
    feed.plans.put(None)
    t0, results = time.monotonic(), None
    while results is None and time.monotonic() - t0 < 5:
        try:
            results = list(stub.Execute(iter([decode(4, 1)]), metadata=AUTH))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
            time.sleep(0.05)
    assert results is not None and results[0].error == "", "a cancelled stream kept the slot"
    assert time.monotonic() - t0 < 2
    stub.Reset(pb.ResetRequest(), metadata=AUTH)


def test_reset_ends_the_open_stream_and_forgets_its_requests(stub):
    feed = PlanFeed()
    old = stub.Execute(feed, metadata=AUTH)
    feed.plans.put(new_plan(1, req_id=7))
    assert next(old).error == ""
    stub.Reset(pb.ResetRequest(), metadata=AUTH)  # a reconnecting scheduler takes over
    assert _code(lambda: next(old)) == grpc.StatusCode.ABORTED
    feed.plans.put(None)
    # request 7 was forgotten: it can be sent again as new, on a new stream
    results = list(stub.Execute(iter([new_plan(2, req_id=7)]), metadata=AUTH))
    assert results[0].error == "" and list(results[0].req_ids) == [7]
    stub.Reset(pb.ResetRequest(), metadata=AUTH)


def test_the_scheduler_client_sends_the_token(address):
    async def connect_and_step(token: str):
        client = ExecutorClient(address, token)
        try:
            info = await client.connect(timeout=10)
            await client.send(codec.plan_from_pb(new_plan(1, req_id=3)))
            return info, await client.receive()
        finally:
            await client.close()

    info, result = asyncio.run(connect_and_step(TOKEN))
    assert info.vocab_size == 512 and result.req_ids == [3] and result.error == ""
    for wrong in ("", "wrong"):
        with pytest.raises(ExecutorUnavailable, match="internal token"):
            asyncio.run(connect_and_step(wrong))


def _list_services(address: str, metadata=None) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = list(stub.ServerReflectionInfo(iter([request]), metadata=metadata))
    return [s.name for s in replies[0].list_services_response.service]


def test_reflection_is_off_by_default(address):
    with pytest.raises(grpc.RpcError) as raised:
        _list_services(address, AUTH)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_insecure_no_auth_and_reflection_only_when_asked_for(model_dirs):
    with running_server(_config(model_dirs, insecure_no_auth=True, enable_reflection=True)) as address:
        assert "llmserve.executor.v1.Executor" in _list_services(address)
        with grpc.insecure_channel(address) as channel:
            assert pb_grpc.ExecutorStub(channel).Handshake(pb.HandshakeRequest()).vocab_size == 512


def test_no_token_and_no_insecure_flag_refuses_to_start(model_dirs):
    with pytest.raises(SystemExit, match="no internal token"):
        asyncio.run(serve(_config(model_dirs)))
