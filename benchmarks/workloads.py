"""The workloads of shared/design/benchmarks.md, as lists of (prompt token ids, output length)."""

from __future__ import annotations

import random

Workload = list[tuple[list[int], int]]


def w1() -> Workload:
    """One request: a 128-token prompt, 256 generated tokens (greedy, EOS ignored)."""
    rng = random.Random(1)
    return [([rng.randint(0, 10000) for _ in range(128)], 256)]


def w2(num_requests: int = 256) -> Workload:
    """nano-vllm's bench.py: prompts and outputs uniform in [100, 1024], ids in [0, 10000].

    random.seed(0); for each request its prompt length then its tokens; only after all
    prompts, each request's output length. 256 requests give 133,966 output tokens.
    """
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
               for _ in range(num_requests)]
    out_lens = [random.randint(100, 1024) for _ in range(num_requests)]
    return list(zip(prompts, out_lens))


def w3(num_requests: int = 512) -> Workload:
    """512 requests, 128-token prompts, 128 output tokens."""
    rng = random.Random(3)
    return [([rng.randint(0, 10000) for _ in range(128)], 128) for _ in range(num_requests)]


def w5(total_tokens: int, num_requests: int = 64) -> Workload:
    """vLLM's CUDA-graph article: requests of a given total length, half prompt, half output."""
    rng = random.Random(5)
    prompt_len = total_tokens // 2
    return [([rng.randint(0, 10000) for _ in range(prompt_len)], total_tokens - prompt_len)
            for _ in range(num_requests)]


def long_context(num_requests: int = 64) -> Workload:
    """64 requests of 3,072-token prompts and 512 output tokens: attention (KV reads) dominates."""
    rng = random.Random(8)
    return [([rng.randint(0, 10000) for _ in range(3072)], 512) for _ in range(num_requests)]
