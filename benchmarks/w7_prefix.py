"""W7: multi-turn chat with a shared system prompt, prefix caching on vs off (full system).

64 conversations run at once; each has 8 turns. Every request of every conversation starts
with the same 1,000-token system prompt; turn t re-sends the conversation so far (its earlier
user messages and the answers it got) plus a new 64-token user message, and asks for 64 tokens.
Reported per mode: TTFT p50/p99 over all requests, total throughput (prompt + generated tokens
per second of wall time), and the prefix-cache hit rate from the status RPC.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import grpc

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc

SYSTEM_TOKENS, USER_TOKENS, ANSWER_TOKENS = 1000, 64, 64
VOCAB_LIMIT = 10000  # token ids drawn below this (the benchmark models have far more)
NUM_CONVERSATIONS, NUM_TURNS = 64, 8


async def _conversation(stub, system: list[int], rng: random.Random, ttfts: list[float]) -> int:
    """Runs one conversation's turns in order; returns the tokens it sent and received."""
    history, total = list(system), 0
    for _ in range(NUM_TURNS):
        history += [rng.randrange(3, VOCAB_LIMIT) for _ in range(USER_TOKENS)]
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=history), params=pb.SamplingParams(
            max_tokens=ANSWER_TOKENS, temperature=0.0, ignore_eos=True))
        t0, first, answer = time.perf_counter(), None, []
        async for msg in stub.Generate(req, timeout=600):
            if first is None:
                first = time.perf_counter() - t0
            answer += msg.token_ids
        ttfts.append(first)
        total += len(history) + len(answer)
        history += answer
    return total


async def _run(address: str) -> dict:
    rng = random.Random(7)
    system = [rng.randrange(3, VOCAB_LIMIT) for _ in range(SYSTEM_TOKENS)]
    ttfts: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        t0 = time.perf_counter()
        totals = await asyncio.gather(*[_conversation(stub, system, random.Random(i), ttfts)
                                        for i in range(NUM_CONVERSATIONS)])
        wall = time.perf_counter() - t0
    ttfts.sort()
    return dict(requests=len(ttfts), wall_s=wall, tokens_per_s=sum(totals) / wall,
                ttft_p50_ms=1e3 * statistics.median(ttfts),
                ttft_p99_ms=1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))])


def run(model: Path, log_dir: Path, device: str = "cuda") -> dict:
    """Both modes, one cluster each (the same model and flags but the cache switch)."""
    from benchmarks.cluster import Cluster

    out = {}
    for mode, flags in (("caching_on", []), ("caching_off", ["--no-enable-prefix-caching"])):
        cluster = Cluster(model, log_dir / mode, ["--device", device], flags, timeout=600)
        try:
            result = asyncio.run(_run(cluster.address))
            status = cluster.status()
            result["prefix_cache_hit_rate"] = status.prefix_cache_hit_rate
            out[mode] = result
        finally:
            cluster.stop()
    on, off = out["caching_on"], out["caching_off"]
    out["ttft_p50_speedup"] = off["ttft_p50_ms"] / on["ttft_p50_ms"]
    return out
