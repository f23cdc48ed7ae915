"""`python -m llmserve` with vLLM-style flags, end to end: each flag reaches its service (seen
through the API, served over TLS), the API key only through the scheduler's environment, and
SIGTERM to the launcher alone stops everything with exit 0.

Reads /proc (Linux) to find the launcher's children and what they were given."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_port
from llmserve.flags import scheduler_has_http_api
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import CPU_EXECUTOR
from tests.integration.reliability.test_tls_auth import certs  # noqa: F401 (a fixture: a test CA, server and client)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
KEY = "launcher-test-api-key-3f9a"


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of a live process; None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[2]))  # a zombie has exited


def _live(where) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and where(_stat(int(p)))]


def _children(pid: int) -> list[int]:
    return _live(lambda stat: stat is not None and stat[0] == pid)


def _group(pgid: int) -> list[int]:
    """Every live process of the group: the launcher started in a session of its own, so that is
    the launcher and everything under it."""
    return _live(lambda stat: stat is not None and stat[1] == pgid)


def _read(pid: int, what: str) -> list[str]:
    return [s.decode() for s in Path(f"/proc/{pid}/{what}").read_bytes().split(b"\0") if s]


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _serving(port: int, credentials) -> bool:
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        try:
            r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_llmserve_with_vllm_flags_streams_and_stops_on_sigterm(model_dirs, tmp_path, certs):  # noqa: F811
    tls = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    port, http_port = free_port(), (free_port() if scheduler_has_http_api() else 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSERVE_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    log = tmp_path / "llmserve.log"
    cmd = [sys.executable, "-m", "llmserve", "--model", str(model_dirs["llama"]), "--max-num-seqs", "4",
           "--max-model-len", "256", "--block-size", "32", "--served-model-name", "tiny-served",
           "--dtype", "float32", "--no-enable-prefix-caching", "--port", str(port),
           "--executor-port", str(free_port()), "--http-port", str(http_port),
           "--executor-args", " ".join(CPU_EXECUTOR), "--api-key", KEY,
           "--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile", str(certs / "server.key")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait(lambda: _serving(port, tls) or proc.poll() is not None, 120, "llmserve serves")
        assert proc.poll() is None, log.read_text()
        children = _children(proc.pid)
        assert len(children) == 2, children
        executor, scheduler = sorted(children, key=lambda pid: "scheduler_svc" in _read(pid, "cmdline"))
        assert "--max-num-seqs" in _read(executor, "cmdline")
        for pid in _group(proc.pid):  # the key is in no service process's argv ...
            assert pid == proc.pid or not any(KEY in arg for arg in _read(pid, "cmdline"))
        # ... and only in the scheduler's environment
        assert f"LLMSERVE_SCHEDULER_API_KEY={KEY}" in _read(scheduler, "environ")
        assert not any(KEY in var for var in _read(executor, "environ"))

        with grpc.secure_channel(f"127.0.0.1:{port}", tls) as channel:  # --ssl-* reached the scheduler
            stub, auth = pb_grpc.LLMServeStub(channel), [("authorization", f"Bearer {KEY}")]
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=auth, timeout=10)
            assert (info.model_name, info.max_model_len, info.block_size) == ("tiny-served", 256, 32)
            request = pb.GenerateRequest(text="Hello there", params=pb.SamplingParams(max_tokens=8, temperature=0))
            messages = list(stub.Generate(request, metadata=auth, timeout=60))
            assert sum(len(m.token_ids) for m in messages) == 8
            assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert messages[-1].usage.completion_tokens == 8
            status = stub.GetServerStatus(pb.GetServerStatusRequest(), metadata=auth, timeout=10)
            assert status.prefix_cache_queries == 0  # --no-enable-prefix-caching reached the scheduler
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(request, timeout=60))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        if http_port:
            _wait(lambda: _connects(http_port), 10, "the HTTP API listens on --http-port")

        proc.send_signal(signal.SIGTERM)  # to the launcher alone: it stops its children itself
        assert proc.wait(timeout=30) == 0, log.read_text()
        _wait(lambda: not _group(proc.pid), 10, f"every process of llmserve exits: {_group(proc.pid)}")
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
