"""The executor service with --tensor-parallel-size 2 (gloo, CPU) as a real process: the
handshake reports the blocks of one rank's share, a plan stream answers as one rank does,
SIGTERM stops every rank, and the death of a rank ends the service (UNAVAILABLE, exit 1)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time

import grpc
import pytest

from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from step_protocol import codec
from tests.executor.conftest import make_runner
from tests.executor.processes import children_running, gone, wait_serving
from tests.executor.service.test_server import decode, new_plan
from tests.executor.tp_helpers import free_port

FLAGS = ["--device", "cpu", "--insecure-no-auth", "--cpu-kv-cache-gib", "0.001", "--max-num-seqs", "4",
         "--max-num-batched-tokens", "64", "--max-model-len", "256", "--tensor-parallel-size", "2"]


def _start(path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "executor_svc", "--model", str(path), "--port", str(port), *FLAGS],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_serving(proc, f"127.0.0.1:{port}")
    except AssertionError:
        proc.kill()
        raise
    return proc, grpc.insecure_channel(f"127.0.0.1:{port}")


@pytest.fixture
def service(model_dirs):
    proc, channel = _start(model_dirs["tiny-llama"])
    workers = children_running(proc.pid, "executor_svc.parallel.worker")
    yield proc, channel, workers
    channel.close()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_handshake_stream_and_clean_shutdown(service, model_dirs):
    proc, channel, workers = service
    assert len(workers) == 1
    stub = pb_grpc.ExecutorStub(channel)
    info = stub.Handshake(pb.HandshakeRequest(), timeout=5)
    single = make_runner(model_dirs["tiny-llama"], num_kv_blocks=0, cpu_kv_cache_gib=0.001)
    assert info.num_blocks == 2 * single.info().num_blocks  # each rank holds 1 of the 2 KV heads
    plans = [new_plan(1, req_id=1, block=1), new_plan(2, req_id=2, block=2)] + [decode(3 + i, 1, 2) for i in range(6)]
    got = [codec.result_from_pb(r) for r in stub.Execute(iter(plans), timeout=30)]
    want = [single.execute(codec.plan_from_pb(p)) for p in plans]
    assert [(g.req_ids, g.token_ids, g.error) for g in got] == [(w.req_ids, w.token_ids, w.error) for w in want]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert all(gone(w) for w in workers)


def test_the_death_of_a_rank_ends_the_service(service):
    """An open plan stream ends UNAVAILABLE, every rank exits and so does the service (1).
    The checks run once the service has exited, each with its stderr: a failure says why."""
    proc, channel, workers = service
    stub = pb_grpc.ExecutorStub(channel)
    plans: queue.Queue = queue.Queue()
    plans.put(new_plan(1))
    stream = stub.Execute(iter(plans.get, None), timeout=60)
    assert next(stream).step_id == 1
    os.kill(workers[0], signal.SIGKILL)
    plans.put(decode(2, 1))
    try:
        ended = f"ended without an error after steps {[r.step_id for r in stream]}"
    except grpc.RpcError as e:
        ended = e
    plans.put(None)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        code = "still running 30 s later"
        proc.kill()
    err = proc.stderr.read()
    assert isinstance(ended, grpc.RpcError) and ended.code() == grpc.StatusCode.UNAVAILABLE, f"{ended}\n{err}"
    assert code == 1, err
    assert "tensor-parallel rank 1 exited with status -9" in err
    with pytest.raises(grpc.RpcError) as e:
        stub.Handshake(pb.HandshakeRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_other_ranks_exit_with_rank_0(service):
    proc, _, workers = service
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while not all(gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(w) for w in workers)
