"""Starts both real services as processes on loopback (integration tests and benchmarks)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmserve.launcher import services_env
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports: all bound at once, so the OS cannot hand out one port twice (two
    free_port() calls in a row can return the same port once the first socket is closed)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Cluster:
    """An executor and a scheduler process serving one model folder. They share a fresh
    internal token (`internal_token`, passed as the launcher passes it); the executor listens
    on `executor_address`. With `http`, the scheduler also serves the OpenAI-compatible HTTP API
    on `http_port` (`http_url`), answering /health before the cluster is returned."""

    def __init__(self, model: Path, log_dir: Path, executor_args=(), scheduler_args=(),
                 timeout: float = 120, executor_module: str = "executor_svc", http: bool = False):
        self.port, executor_port, self.http_port = free_ports(3)
        self.http_url = f"http://127.0.0.1:{self.http_port}" if http else None
        if http:
            scheduler_args = ["--http-port", str(self.http_port), *scheduler_args]
        self.internal_token = secrets.token_urlsafe(32)
        self.executor_address = f"127.0.0.1:{executor_port}"
        env = services_env({**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, self.internal_token)
        log_dir.mkdir(parents=True, exist_ok=True)
        self._logs = [open(log_dir / "executor.log", "w"), open(log_dir / "scheduler.log", "w")]
        self._executor_cmd = [sys.executable, "-m", executor_module, "--model", str(model),
                              "--port", str(executor_port), *executor_args]
        self._env = env
        self.procs = [
            subprocess.Popen(self._executor_cmd, cwd=ROOT, env=env, stdout=self._logs[0],
                             stderr=subprocess.STDOUT),
            subprocess.Popen(
                [sys.executable, "-m", "scheduler_svc", "--port", str(self.port),
                 "--executor-address", self.executor_address, *scheduler_args],
                cwd=ROOT, env=env, stdout=self._logs[1], stderr=subprocess.STDOUT),
        ]
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.LLMServeStub(self.channel)
        try:
            self._wait_serving(timeout)
        except BaseException:
            self.stop()  # no process outlives a cluster that failed to start
            raise

    def _wait_serving(self, timeout: float) -> None:
        health = health_pb2_grpc.HealthStub(self.channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a service exited early:\n{self.logs()}")
            try:
                r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING and self._http_up():
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"services not serving after {timeout}s:\n{self.logs()}")

    def _http_up(self) -> bool:
        """True without the HTTP API, else once /health answers (it starts just after gRPC)."""
        if self.http_url is None:
            return True
        try:
            urllib.request.urlopen(self.http_url + "/health", timeout=2)
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    def restart_executor(self) -> None:
        """Kills the executor process and starts a fresh one on the same port."""
        self.procs[0].kill()
        self.procs[0].wait()
        self.procs[0] = subprocess.Popen(self._executor_cmd, cwd=ROOT, env=self._env,
                                         stdout=self._logs[0], stderr=subprocess.STDOUT)

    def logs(self, tail: int | None = 4000) -> str:
        """Both services' logs, the last `tail` characters of each (None: all of them, for tests
        that look for a line: one access line a request soon pushes it out of the tail)."""
        return "\n".join(f"--- {f.name}\n{Path(f.name).read_text()[-tail if tail else 0:]}"
                         for f in self._logs)

    def status(self) -> pb.GetServerStatusResponse:
        return self.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)

    def wait_idle(self, timeout: float = 10) -> pb.GetServerStatusResponse:
        """Status once no request runs or waits and every block is back in the pool."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            idle = s.num_running == 0 and s.num_waiting == 0 and s.free_blocks == s.total_blocks
            if idle or time.monotonic() > deadline:
                return s
            time.sleep(0.05)

    def stop(self) -> None:
        self.channel.close()
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self._logs:
            f.close()


def generate(stub, *, prompt_ids=None, text=None, timeout=120, **params) -> tuple[list[int], str, pb.GenerateResponse]:
    """Streams one request; returns (all token ids, all text, the last message)."""
    req = pb.GenerateRequest(params=pb.SamplingParams(**params))
    if prompt_ids is not None:
        req.token_ids.ids.extend(prompt_ids)
    else:
        req.text = text
    ids, texts, last = [], [], None
    for msg in stub.Generate(req, timeout=timeout):
        ids += msg.token_ids
        texts.append(msg.text)
        last = msg
    return ids, "".join(texts), last
