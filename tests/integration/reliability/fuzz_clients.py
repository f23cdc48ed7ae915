"""The fuzz run's clients and probes (test_fuzz_doors.py): an HTTP stream read to its end, both
doors' health, and the API process's VmRSS."""

from __future__ import annotations

import json
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

try:
    import httpx
except ImportError:  # the fork the openai package ships with here
    import httpx2 as httpx


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def settled_rss_kib(pid: int, period_s: float) -> int:
    """VmRSS once it has stopped falling (the heap trims run 0.25 s after a big request ends),
    at most period_s later."""
    deadline = time.monotonic() + period_s
    low, low_at = rss_kib(pid), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - low_at < 2.0:
        time.sleep(0.25)
        rss = rss_kib(pid)
        if rss < low:
            low, low_at = rss, time.monotonic()
    return low


def sse(client: httpx.Client, path: str, body: dict) -> tuple[list[int], str]:
    """An HTTP streaming request's token ids and text; raises on anything but a clean stream."""
    ids, text, done = [], [], False
    with client.stream("POST", path, json=body, timeout=60) as r:
        if r.status_code != 200:
            raise AssertionError(f"{path}: HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise AssertionError(f"{path}: error event {chunk}")
            for choice in chunk["choices"]:
                ids += choice.get("token_ids") or []
                text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    assert done, f"{path}: the stream ended without [DONE]"
    return ids, "".join(text)


def health(cluster, http: httpx.Client) -> tuple[str, object]:
    try:
        g = health_pb2_grpc.HealthStub(cluster.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        grpc_status = health_pb2.HealthCheckResponse.ServingStatus.Name(g.status)
    except grpc.RpcError as e:
        grpc_status = f"error {e.code().name}"
    try:
        http_status = http.get("/health", timeout=10).status_code
    except httpx.HTTPError as e:
        http_status = f"error {e!r}"
    return grpc_status, http_status
