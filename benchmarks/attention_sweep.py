"""Decode attention launch configurations swept at large batch (issue 12: >= 90% of bandwidth).

    python -m benchmarks.attention_sweep [--json OUT]

llama-1b attention shapes (32 query heads, 8 KV heads, head dim 64, block size 16), bf16,
block tables a random permutation of the blocks (scattered, as a long-running server's are).
Each configuration (block_n, num_splits, num_warps, num_stages) is timed inside a CUDA graph
of 20 calls; bandwidth = the K and V bytes the batch must read / time, against the H200's
measured device-to-device copy bandwidth (benchmarks/decode_step.py HBM_BYTES_PER_S). The
shape-derived default (`decode_launch_config`) is timed beside the sweep.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from benchmarks.decode_step import HBM_BYTES_PER_S
from kernels.attention_decode import paged_decode_attention_triton

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 64, 16
SHAPES = ((64, 512), (128, 512), (256, 512), (256, 1024), (128, 2048))  # (batch, context)
CONFIGS = [dict(block_n=bn, num_splits=s, num_warps=w, num_stages=st)
           for bn, s, w, st in itertools.product((32, 64, 128), (1, 2), (2, 4, 8), (2, 3, 4))]


def _inputs(batch: int, context: int):
    blocks_per_seq = context // BLOCK
    num_blocks = batch * blocks_per_seq + 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = [torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
          for _ in range(2)]
    tables = (torch.randperm(num_blocks - 1, device="cuda", generator=gen) + 1).to(torch.int32)
    tables = tables.reshape(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, kv[0], kv[1], tables, seq_lens


def _time_us(fn, calls: int = 20, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def _bw(nbytes: int, us: float) -> float:
    """Fraction of the copy bandwidth."""
    return nbytes / (us * 1e-6) / HBM_BYTES_PER_S


def sweep() -> list[dict]:
    rows = []
    for batch, context in SHAPES:
        q, k, v, tables, seq_lens = _inputs(batch, context)
        out = torch.empty_like(q)
        kv_bytes = 2 * batch * context * KV_HEADS * DIM * 2
        scale = DIM ** -0.5

        def run(**cfg):
            return _time_us(lambda: paged_decode_attention_triton(q, k, v, tables, seq_lens, scale, out=out, **cfg))

        default_us = run()
        timed = []
        for cfg in CONFIGS:
            try:
                timed.append((run(**cfg), cfg))
            except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                print(f"skip {cfg}: {type(e).__name__}", flush=True)
        best_us, best = min(timed, key=lambda t: t[0])
        row = dict(batch=batch, context=context, default_us=default_us,
                   default_bw=_bw(kv_bytes, default_us),
                   best_us=best_us, best=best, best_bw=_bw(kv_bytes, best_us),
                   top5=[(round(t, 2), c) for t, c in sorted(timed, key=lambda t: t[0])[:5]])
        print(f"b={batch:4d} ctx={context:5d} default {default_us:7.1f} us ({row['default_bw']:.0%}) "
              f"best {best_us:7.1f} us ({row['best_bw']:.0%}) {best}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    rows = sweep()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
