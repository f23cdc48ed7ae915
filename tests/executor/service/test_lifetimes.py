"""The executor as a real process (python -m executor_svc) and its gRPC endpoint child: gRPC is
loaded in the endpoint only; the endpoint killed ends the executor (status 1, one line); a SIGKILLed executor takes the endpoint along;
SIGTERM, and Ctrl-C to the whole process group, stop both with status 0 (no traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc
from tests.executor.processes import children_running, gone, wait_serving
from tests.executor.service.test_endpoint import maps
from tests.executor.service.test_server import new_plan
from tests.executor.tp_helpers import free_port

FLAGS = ["--device", "cpu", "--insecure-no-auth", "--num-kv-blocks", "32", "--max-num-seqs", "4",
         "--max-num-batched-tokens", "64", "--max-model-len", "256"]


@pytest.fixture
def executor(model_dirs):
    """(process, address, endpoint pid) of a serving executor; killed at the end if still there."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "executor_svc", "--model", str(model_dirs["tiny-llama"]),
                             "--port", str(port), *FLAGS], stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        wait_serving(proc, address)
        endpoints = children_running(proc.pid, "executor_svc.service.endpoint")
        assert len(endpoints) == 1, endpoints
        yield proc, address, endpoints[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone(pid)


def _step(address: str) -> pb.StepResult:
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.ExecutorStub(channel).Execute(iter([new_plan(1)]), timeout=30))[0]


def test_the_endpoint_killed_ends_the_executor(executor):
    proc, address, endpoint = executor
    assert _step(address).error == ""
    assert "cygrpc" in maps(endpoint) and "cygrpc" not in maps(proc.pid)  # gRPC runs in the endpoint only
    os.kill(endpoint, signal.SIGKILL)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        code = "still running 20 s later"
    err = proc.stderr.read()
    assert code == 1, err
    assert "llmserve-executor: error: the gRPC endpoint process exited with status -9" in err
    assert "Traceback" not in err


def test_a_sigkilled_executor_takes_the_endpoint_along(executor):
    proc, _, endpoint = executor
    proc.kill()
    proc.wait()
    assert _wait_gone(endpoint, 5), "the endpoint outlived its executor"


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C to the group"])
def test_sigterm_and_ctrl_c_stop_both(executor, how):
    proc, address, endpoint = executor
    assert _step(address).error == ""
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)  # as the launcher, docker and systemd stop it
    else:
        os.killpg(proc.pid, signal.SIGINT)  # the endpoint gets it too, and waits for its parent's word
    assert proc.wait(30) == 0
    err = proc.stderr.read()
    assert _wait_gone(endpoint, 5), err
    assert "Traceback" not in err and "stopping" in err
