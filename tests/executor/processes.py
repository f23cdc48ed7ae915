"""Processes of a running executor, read from /proc (Linux): its children by module, whether a
process is gone, and waiting until an executor serves."""

from __future__ import annotations

import os
import subprocess
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def children_running(pid: int, module: str) -> list[int]:
    """The children of `pid` started as `python -m <module>` (the ranks; the gRPC endpoint is a child too)."""
    def cmdline(child: int) -> list[bytes]:
        with open(f"/proc/{child}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    return [c for c in _children(pid) if module.encode() in cmdline(c)]


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_serving(proc: subprocess.Popen, address: str) -> None:
    """Until the executor at `address` answers health SERVING (its process must not exit first)."""
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise AssertionError("the executor did not start")
