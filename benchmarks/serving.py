"""W6: a serving benchmark, chat-like requests arriving over time through the public gRPC API.

    python -m benchmarks.serving --address 127.0.0.1:50051 --vocab-size 32000 \
        --rates 2,8,32,inf --num-requests 200 --seed 0 [--slo-ttft-ms 500 --slo-tpot-ms 50] \
        [--json out.json]

Workload (seeded, numpy Generator): N requests whose prompt and output lengths are log-normal,
rounded and clipped, like chat traffic (many short turns, a long tail):

- prompt tokens: median 256, sigma 1.0 (of the log), clipped to [16, 1536];
- output tokens: median 128, sigma 0.8, clipped to [8, 512];
- prompt token ids uniform in [100, vocab_size).

Greedy, EOS ignored, so each request streams exactly its output length. Lengths depend on the
seed only; token ids also on a per-rate `variant`, so the prefix cache cannot serve one rate's
prompts from an earlier rate's. Arrivals: a Poisson process at `rate` requests/s (the first at
t=0, then exponential gaps of mean 1/rate), or all at t=0 for rate = inf (a burst). Each request
is sent at its arrival time, whatever is still running. Metrics and the SLO (goodput) are
defined in benchmarks/serving_stats.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from benchmarks.serving_stats import RequestRecord, summarize, table_lines
from benchmarks.workloads import Workload
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc

MIN_TOKEN_ID = 100  # below the ids a tokenizer keeps for special tokens
_LENGTHS, _IDS, _ARRIVALS = 0, 1, 2  # independent random streams of one seed


@dataclass(frozen=True)
class LengthDist:
    """A log-normal length distribution: median, sigma of the log, clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, num: int) -> np.ndarray:
        draws = rng.lognormal(math.log(self.median), self.sigma, num)
        return np.clip(np.rint(draws), self.lo, self.hi).astype(np.int64)


PROMPT_LENGTHS = LengthDist(median=256, sigma=1.0, lo=16, hi=1536)
OUTPUT_LENGTHS = LengthDist(median=128, sigma=0.8, lo=8, hi=512)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    """A generator for one named stream of a seed (spawn keys keep the streams independent)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=stream))


def make_requests(num: int, vocab_size: int, seed: int, prompt: LengthDist = PROMPT_LENGTHS,
                  output: LengthDist = OUTPUT_LENGTHS, variant: int = 0) -> Workload:
    """num (prompt token ids, output length) pairs; lengths depend on seed only, ids also on
    variant."""
    if vocab_size <= MIN_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {MIN_TOKEN_ID}, got {vocab_size}")
    lengths = _rng(seed, _LENGTHS)
    prompt_lens, output_lens = prompt.sample(lengths, num), output.sample(lengths, num)
    ids = _rng(seed, _IDS, variant)
    return [(ids.integers(MIN_TOKEN_ID, vocab_size, int(n)).tolist(), int(m))
            for n, m in zip(prompt_lens, output_lens)]


def arrival_times(num: int, rate: float, seed: int) -> np.ndarray:
    """Send times in seconds from the start: a Poisson process at rate requests/s starting
    with one request at t=0, or all zeros for rate = inf."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (inf for a burst), got {rate}")
    if math.isinf(rate):
        return np.zeros(num)
    gaps = _rng(seed, _ARRIVALS).exponential(1.0 / rate, num)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])[:num]


async def _send(stub: pb_grpc.LLMServeStub, prompt: list[int], max_tokens: int,
                timeout_s: float) -> RequestRecord:
    """Streams one request; an RPC error or a wrong token count marks it failed."""
    record = RequestRecord(prompt_tokens=len(prompt), max_tokens=max_tokens)
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    start = last = time.perf_counter()
    try:
        async for msg in stub.Generate(req, timeout=timeout_s):
            if not msg.token_ids:  # nothing to time: no token arrived with it
                continue
            now = time.perf_counter()
            if record.ttft_s is None:
                record.ttft_s = now - start
            else:
                record.itl_s.append(now - last)
            last = now
            record.output_tokens += len(msg.token_ids)
    except grpc.aio.AioRpcError as e:
        record.error = f"{e.code().name}: {e.details()}"
        return record
    record.e2e_s = last - start
    if record.output_tokens != max_tokens:
        record.error = f"expected {max_tokens} tokens, got {record.output_tokens}"
    return record


async def _run_rate(stub: pb_grpc.LLMServeStub, workload: Workload, arrivals: np.ndarray,
                    timeout_s: float) -> tuple[list[RequestRecord], float]:
    """Sends each request at its arrival time (asyncio.sleep until then); returns the records
    in workload order and the seconds from the start to the last request's end."""
    tasks = []
    t0 = time.perf_counter()
    for (prompt, max_tokens), at in zip(workload, arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_send(stub, prompt, max_tokens, timeout_s)))
    records = await asyncio.gather(*tasks)
    return records, time.perf_counter() - t0


async def _run_rates(address: str, vocab_size: int, rates: list[float], num_requests: int,
                     seed: int, prompt: LengthDist, output: LengthDist, slo_ttft_ms: float,
                     slo_tpot_ms: float, timeout_s: float) -> list[dict]:
    options = [("grpc.max_receive_message_length", 64 << 20)]
    rows = []
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        for variant, rate in enumerate(rates):
            workload = make_requests(num_requests, vocab_size, seed, prompt, output, variant)
            records, duration = await _run_rate(stub, workload, arrival_times(num_requests, rate, seed),
                                                timeout_s)
            rows.append({"rate": rate, **summarize(records, duration, slo_ttft_ms, slo_tpot_ms)})
    return rows


def run_serving(address: str, vocab_size: int, rates: list[float], num_requests: int, seed: int,
                *, prompt: LengthDist = PROMPT_LENGTHS, output: LengthDist = OUTPUT_LENGTHS,
                slo_ttft_ms: float = 500.0, slo_tpot_ms: float = 50.0,
                timeout_s: float = 600.0) -> list[dict]:
    """One summary row per rate, the rates one after another (each waits for the last to drain),
    on a fresh event loop (uvloop when installed)."""
    coro = _run_rates(address, vocab_size, list(rates), num_requests, seed, prompt, output,
                      slo_ttft_ms, slo_tpot_ms, timeout_s)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--vocab-size", type=int, required=True, help="the served model's vocabulary")
    p.add_argument("--rates", type=_rates, default=[2.0, 8.0, 32.0, math.inf],
                   help="requests/s, comma-separated; inf sends all at once")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = run_serving(args.address, args.vocab_size, args.rates, args.num_requests, args.seed,
                       slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                       timeout_s=args.timeout_s)
    print("\n".join(table_lines(rows)))
    for row in rows:
        if row["errors"]:
            print(f"rate {row['rate']:g}: {row['failed']} failed: {row['errors']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
