"""An asyncio gRPC load client: sends a workload at once and measures what the client sees."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import grpc

from benchmarks.workloads import Workload
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc


@dataclass
class LoadResult:
    num_requests: int
    output_tokens: int
    wall_s: float
    tpot_ms_median: float  # median over requests of (last - first token time) / (tokens - 1)
    ttft_ms_median: float
    ttft_ms_p90: float = 0.0  # how long the last requests waited to be admitted (the intake)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


async def _one(stub, prompt: list[int], out_len: int, temperature: float, t0: float):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(
        max_tokens=out_len, temperature=temperature, ignore_eos=True, seed=len(prompt)))
    times, count = [], 0
    async for msg in stub.Generate(req):
        now = time.perf_counter()
        n = len(msg.token_ids)
        times += [now] * n
        count += n
    if count != out_len:
        raise RuntimeError(f"expected {out_len} tokens, got {count}")
    tpot = (times[-1] - times[0]) / (count - 1) if count > 1 else 0.0
    return count, times[0] - t0, tpot


async def run_load(address: str, workload: Workload, temperature: float = 0.0) -> LoadResult:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        t0 = time.perf_counter()
        results = await asyncio.gather(*[_one(stub, p, n, temperature, t0) for p, n in workload])
        wall = time.perf_counter() - t0
    return LoadResult(
        num_requests=len(workload), output_tokens=sum(c for c, _, _ in results), wall_s=wall,
        tpot_ms_median=1e3 * statistics.median(t for _, _, t in results),
        ttft_ms_median=1e3 * statistics.median(t for _, t, _ in results),
        ttft_ms_p90=1e3 * sorted(t for _, t, _ in results)[int(0.9 * (len(results) - 1))],
    )


def load(address: str, workload: Workload, temperature: float = 0.0) -> LoadResult:
    """Runs run_load on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop

        return uvloop.run(run_load(address, workload, temperature))
    except ImportError:
        return asyncio.run(run_load(address, workload, temperature))
