"""Faults around the scheduler (both real services as processes): a burst of thousands of
streams, and an executor that hangs (SIGSTOP) while requests run or while idle."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import start_cluster

PROMPT = [5, 17, 42, 99]


async def _burst(address: str, num_streams: int, max_tokens: int = 4) -> collections.Counter:
    """Opens num_streams streams at once on one channel; counts how each ended."""
    async def one(stub, i):
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7 + i % 50]), params=pb.SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        n = 0
        try:
            async for msg in stub.Generate(req, timeout=120):
                n += len(msg.token_ids)
        except grpc.aio.AioRpcError as e:
            return e.code().name if n == 0 else f"{e.code().name} after {n} tokens"
        return "OK" if n == max_tokens else f"OK with {n} tokens"

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        return collections.Counter(await asyncio.gather(*[one(stub, i) for i in range(num_streams)]))


def test_a_burst_of_streams_completes_or_is_refused_explicitly(model_dirs, tmp_path_factory):
    """2,000 streams at once: gRPC's own load shedding used to cancel 3-6% of them silently
    (CANCELLED, zero tokens, nothing logged). Now every stream completes; past the admission
    bound (max_num_seqs + --max-waiting) the rest get RESOURCE_EXHAUSTED, and the log says so."""
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], "burst",
                            scheduler_args=["--max-waiting", "1000"])
    try:
        assert asyncio.run(_burst(cluster.address, 1000)) == {"OK": 1000}
        capacity = 64 + 1000  # the CPU executor's max_num_seqs plus --max-waiting
        # long enough requests that the server cannot drain the burst while it arrives (with 4
        # tokens each a fast scheduler sometimes admitted all 2,000)
        outcome = asyncio.run(_burst(cluster.address, 2000, max_tokens=32))
        assert set(outcome) == {"OK", "RESOURCE_EXHAUSTED"}, outcome
        assert outcome["OK"] >= capacity, outcome
        assert "server full: refused" in cluster.logs(tail=None)
        assert cluster.wait_idle().free_blocks == cluster.status().total_blocks
    finally:
        cluster.stop()


def _health(cluster) -> int:
    stub = health_pb2_grpc.HealthStub(cluster.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _wait_for(predicate, timeout: float) -> float:
    """Seconds until predicate() held; fails after timeout."""
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def hang_cluster(model_dirs, tmp_path_factory):
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "hang", scheduler_args=[
        "--executor-step-timeout", "2", "--executor-health-interval", "0.5"])
    yield c
    os.kill(c.procs[0].pid, signal.SIGCONT)  # never leave a stopped process behind
    c.stop()


def test_a_hung_executor_fails_streams_then_service_resumes(hang_cluster):
    cluster = hang_cluster
    expected, _, _ = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=24, temperature=0.0,
                              ignore_eos=True)
    long_req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), params=pb.SamplingParams(
        max_tokens=1500, temperature=0.0, ignore_eos=True))
    call = cluster.stub.Generate(long_req, timeout=60)
    next(call)  # streaming has started
    executor = cluster.procs[0].pid
    os.kill(executor, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "hung" in err.value.details()
        assert time.monotonic() - t0 < 2 + 2.0  # the step timeout, plus slack
        _wait_for(lambda: _health(cluster) == health_pb2.HealthCheckResponse.NOT_SERVING, 3)
        status = cluster.status()
        assert not status.executor_available and (status.num_running, status.total_blocks) == (0, 0)
        with pytest.raises(grpc.RpcError) as err:
            generate(cluster.stub, prompt_ids=PROMPT, max_tokens=4, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        os.kill(executor, signal.SIGCONT)
    _wait_for(lambda: _health(cluster) == health_pb2.HealthCheckResponse.SERVING, 20)
    assert cluster.status().executor_available
    again, _, _ = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    assert again == expected
    assert cluster.wait_idle().free_blocks == cluster.status().total_blocks


def test_an_idle_hung_executor_is_noticed(hang_cluster):
    cluster = hang_cluster
    assert _health(cluster) == health_pb2.HealthCheckResponse.SERVING
    executor = cluster.procs[0].pid
    os.kill(executor, signal.SIGSTOP)
    try:  # pinged every 0.5 s with a 0.5 s deadline
        _wait_for(lambda: _health(cluster) == health_pb2.HealthCheckResponse.NOT_SERVING, 3)
        assert not cluster.status().executor_available
    finally:
        os.kill(executor, signal.SIGCONT)
    _wait_for(lambda: _health(cluster) == health_pb2.HealthCheckResponse.SERVING, 20)
    ids, _, last = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(ids) == 4 and last.finish_reason == pb.FINISH_REASON_LENGTH
