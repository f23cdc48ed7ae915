"""The gRPC server end to end on loopback: health, handshake, an Execute stream, Reset."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from executor_svc.config import ExecutorConfig
from executor_svc.server import serve
from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def address(model_dirs):
    config = ExecutorConfig(model=str(model_dirs["tiny-qwen3"]), model_name="tiny", port=0,
                            max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=32, max_model_len=256)
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
    yield f"127.0.0.1:{port[0]}"
    loop.call_soon_threadsafe(stop.set)
    thread.join(15)
    assert not thread.is_alive()


def test_health_and_handshake(address):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        info = pb_grpc.ExecutorStub(channel).Handshake(pb.HandshakeRequest())
    assert (info.model_name, info.vocab_size, list(info.eos_token_ids)) == ("tiny", 512, [1])
    assert (info.num_blocks, info.block_size, info.max_num_seqs, info.max_model_len) == (32, 16, 4, 256)
    assert info.device == "cpu" and info.dtype == "float32" and list(info.cuda_graph_sizes) == []


def test_execute_stream_in_order_and_errors_do_not_end_it(address):
    new = pb.NewRequest(req_id=1, token_ids=[5, 6, 7, 8], sampler_params=pb.SamplerParams(temperature=0.0),
                        block_ids=[1], num_scheduled_tokens=4)

    def decode(req_id: int) -> pb.CachedRequests:
        return pb.CachedRequests(req_ids=[req_id], num_scheduled_tokens=[1], num_new_blocks=[0])

    plans = [pb.StepPlan(step_id=1, new_requests=[new]),
             pb.StepPlan(step_id=2, cached_requests=decode(99)),
             pb.StepPlan(step_id=3, cached_requests=decode(1))]
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ExecutorStub(channel)
        results = list(stub.Execute(iter(plans)))
        stub.Reset(pb.ResetRequest())
    assert [r.step_id for r in results] == [1, 2, 3]
    assert list(results[0].req_ids) == [1] and results[0].error == ""
    assert "99" in results[1].error
    assert list(results[2].req_ids) == [1] and results[2].graph_size == 0
