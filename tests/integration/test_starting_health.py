"""While the executor is still starting, the public port answers: health NOT_SERVING and
UNAVAILABLE for LLMServe calls, not refused connections; then it serves without a gap."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_ports, generate
from llmserve.launcher import services_env
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import CPU_KV


def _health(channel) -> int | None:
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1).status
    except grpc.RpcError:
        return None


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_not_serving_while_the_executor_starts_then_serving(model_dirs, tmp_path):
    port, executor_port = free_ports(2)
    env = services_env({**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                       secrets.token_urlsafe(32))
    log = (tmp_path / "scheduler.log").open("w")
    procs = [subprocess.Popen([sys.executable, "-m", "scheduler_svc", "--port", str(port),
                               "--executor-address", f"127.0.0.1:{executor_port}"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        status = _until(lambda: _health(channel) is not None, 60, "the public port answers")
        assert _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING, status
        stub = pb_grpc.LLMServeStub(channel)
        try:
            stub.Complete(pb.GenerateRequest(text="hi"), timeout=5)
            raise AssertionError("Complete answered before the executor was ready")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE and "starting" in e.details()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "executor_svc", "--model", str(model_dirs["llama"]),
             "--port", str(executor_port), *CPU_KV], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT))
        seen = set()

        def serving():
            s = _health(channel)
            seen.add(s)
            return s == health_pb2.HealthCheckResponse.SERVING

        _until(serving, 120, "SERVING once the executor is up")
        assert None not in seen, "the port refused a connection during the hand-over"
        tokens, _, last = generate(stub, prompt_ids=[1, 2, 3], max_tokens=4, temperature=0.0, ignore_eos=True)
        assert len(tokens) == 4 and last.finish_reason == pb.FINISH_REASON_LENGTH
    finally:
        channel.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
