"""No blocking call on the scheduler's event loop while it starts: with a tokenizer that takes
3 s to load, the public port (the starting server on the same loop) keeps answering health
within 0.5 s, then serves. The scheduler runs in this process (its loop on the main thread, so
its signal handlers work) against the fake executor (benchmarks/fake_executor.py)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_ports
from llmserve.flags import services_env
from scheduler_svc.api import server
from scheduler_svc.config import from_args
from scheduler_svc.core.tokenizer import Tokenizer

SERVING = health_pb2.HealthCheckResponse.SERVING


def poll_health(port: int, answers: list, deadline_s: float = 90.0) -> None:
    """Health every 10 ms (0.5 s timeout; None = no answer) until SERVING or the deadline,
    then SIGINT to this process: the scheduler's loop stops. (A second server taking the port
    over at start cancelled the checks racing its stop: CI caught one in ~100 polls at 50 ms.)"""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                   timeout=0.5).status
            except grpc.RpcError:
                status = None
            answers.append(status)
            if status == SERVING:
                break
            time.sleep(0.01)
    finally:
        channel.close()
        os.kill(os.getpid(), signal.SIGINT)


def test_health_answers_while_the_tokenizer_loads(tmp_path, monkeypatch):
    from executor_svc.model_loader.random_model import build_tokenizer

    build_tokenizer(tmp_path, 1024, 4096)
    port, executor_port = free_ports(2)
    for key, value in services_env({}, secrets.token_urlsafe(32)).items():
        monkeypatch.setenv(key, value)
    fake = subprocess.Popen([sys.executable, "-m", "benchmarks.fake_executor", "--model", str(tmp_path),
                             "--port", str(executor_port), "--step-ms", "1"], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    load = Tokenizer.from_pretrained.__func__

    def slow_load(cls, folder):
        time.sleep(3.0)
        return load(cls, folder)

    monkeypatch.setattr(Tokenizer, "from_pretrained", classmethod(slow_load))
    config = from_args(["--port", str(port), "--host", "127.0.0.1",
                        "--executor-address", f"127.0.0.1:{executor_port}"])
    answers: list = []
    poller = threading.Thread(target=poll_health, args=(port, answers), daemon=True)
    try:
        poller.start()
        asyncio.run(server.serve(config))
    finally:
        poller.join(timeout=10)
        fake.terminate()
        fake.wait(timeout=30)
    first = next(i for i, a in enumerate(answers) if a is not None)  # the port is up
    assert answers[-1] == SERVING
    assert None not in answers[first:], f"health went unanswered while starting: {answers[first:]}"
