"""No blocking call on the scheduler's event loop while it starts: with a tokenizer that takes
3 s to load, the public port (the starting server on the same loop) keeps answering health
within 0.5 s, then serves. The scheduler runs in its own process (`llmserve-scheduler`'s
main, its tokenizer load slowed) against the fake executor (benchmarks/fake_executor.py).

Not in the pytest worker: that process's heap holds every earlier test's objects, and a full
garbage collection of it (any allocation may start one, in any thread, holding the GIL) took
over 0.5 s on a loaded CI machine: a stall of the test's process, not of the scheduler's."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_ports
from llmserve.flags import services_env

SERVING = health_pb2.HealthCheckResponse.SERVING
SLOW_SCHEDULER = """
import sys, time
from scheduler_svc.api import server
from scheduler_svc.core.tokenizer import Tokenizer
load = Tokenizer.from_pretrained.__func__
def slow_load(cls, folder):
    time.sleep(3.0)
    return load(cls, folder)
Tokenizer.from_pretrained = classmethod(slow_load)
server.main(sys.argv[1:])
"""


def poll_health(port: int, scheduler: subprocess.Popen, deadline_s: float = 90.0) -> list:
    """Health every 10 ms (0.5 s timeout; None = no answer) until SERVING, the scheduler's
    exit or the deadline."""
    answers: list = []
    end = time.monotonic() + deadline_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while time.monotonic() < end and scheduler.poll() is None:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                                   timeout=0.5).status
            except grpc.RpcError:
                status = None
            answers.append(status)
            if status == SERVING:
                break
            time.sleep(0.01)
    return answers


def test_health_answers_while_the_tokenizer_loads(tmp_path):
    from executor_svc.model_loader.random_model import build_tokenizer

    build_tokenizer(tmp_path, 1024, 4096)
    port, executor_port = free_ports(2)
    env = {**os.environ, **services_env({}, secrets.token_urlsafe(32))}
    fake = subprocess.Popen([sys.executable, "-m", "benchmarks.fake_executor", "--model", str(tmp_path),
                             "--port", str(executor_port), "--step-ms", "1"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    log = tmp_path / "scheduler.log"
    scheduler = subprocess.Popen([sys.executable, "-c", SLOW_SCHEDULER, "--port", str(port), "--host",
                                  "127.0.0.1", "--executor-address", f"127.0.0.1:{executor_port}"],
                                 cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        answers = poll_health(port, scheduler)
        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(timeout=30) == 0, log.read_text()
    finally:
        for proc in (scheduler, fake):
            proc.terminate()
            proc.wait(timeout=30)
    first = next(i for i, a in enumerate(answers) if a is not None)  # the port is up
    assert answers[-1] == SERVING, log.read_text()
    assert None not in answers[first:], f"health went unanswered while starting: {answers[first:]}"
    # the 3 s load was polled through (every ~10 ms), not skipped
    assert answers.count(health_pb2.HealthCheckResponse.NOT_SERVING) >= 100, answers
