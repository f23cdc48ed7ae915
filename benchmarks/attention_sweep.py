"""Decode attention launch configurations swept at large batch (issue 12: >= 90% of bandwidth).

    python -m benchmarks.attention_sweep [--kv bf16|fp8|both] [--json OUT]

llama-1b attention shapes (32 query heads, 8 KV heads, head dim 64, block size 16), bf16 q over
a bf16 cache and (`--kv fp8`, both by default) over an FP8 e4m3 cache (k/v scales 0.02, products
in fp16: kernels/attention_decode.py; its rows print with a leading `kv=fp8`, its tiles go to
256 tokens as they hold half the bytes), block tables a random permutation of the blocks
(scattered, as a long-running server's are).
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
SHAPES = ((64, 512), (128, 512), (256, 512), (256, 1024), (64, 2048), (128, 2048))  # (batch, context)
BLOCK_NS = {"bf16": (32, 64, 128), "fp8": (64, 128, 256)}
FP8_SCALE = 0.02  # randn / 0.02 reaches ~250 of e4m3's 448


def _configs(kv: str) -> list[dict]:
    return [dict(block_n=bn, num_splits=s, num_warps=w, num_stages=st)
            for bn, s, w, st in itertools.product(BLOCK_NS[kv], (1, 2), (2, 4, 8), (2, 3, 4))]


CONFIGS = _configs("bf16")


def _inputs(batch: int, context: int, kv_dtype: str = "bf16"):
    blocks_per_seq = context // BLOCK
    num_blocks = batch * blocks_per_seq + 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = [torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
          for _ in range(2)]
    tables = (torch.randperm(num_blocks - 1, device="cuda", generator=gen) + 1).to(torch.int32)
    tables = tables.reshape(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    if kv_dtype == "fp8":
        kv = [(c.float() / FP8_SCALE).clamp(-448, 448).to(torch.float8_e4m3fn) for c in kv]
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


def sweep(kv: str = "bf16") -> list[dict]:
    rows = []
    for batch, context in SHAPES:
        q, k, v, tables, seq_lens = _inputs(batch, context, kv)
        out = torch.empty_like(q)
        kv_bytes = 2 * batch * context * KV_HEADS * DIM * k.element_size()
        scale = DIM ** -0.5
        scales = {}
        if kv == "fp8":
            scales = dict(k_scale=torch.tensor([FP8_SCALE], device="cuda"),
                          v_scale=torch.tensor([FP8_SCALE], device="cuda"))

        def run(**cfg):
            return _time_us(lambda: paged_decode_attention_triton(q, k, v, tables, seq_lens, scale, out=out,
                                                                  **scales, **cfg))

        default_us = run()
        timed = []
        for cfg in _configs(kv):
            try:
                timed.append((run(**cfg), cfg))
            except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
                print(f"skip {cfg}: {type(e).__name__}", flush=True)
        best_us, best = min(timed, key=lambda t: t[0])
        row = dict(kv=kv, batch=batch, context=context, default_us=default_us,
                   default_bw=_bw(kv_bytes, default_us),
                   best_us=best_us, best=best, best_bw=_bw(kv_bytes, best_us),
                   top5=[(round(t, 2), c) for t, c in sorted(timed, key=lambda t: t[0])[:5]])
        tag = "kv=fp8 " if kv == "fp8" else ""
        print(f"{tag}b={batch:4d} ctx={context:5d} default {default_us:7.1f} us ({row['default_bw']:.0%}) "
              f"best {best_us:7.1f} us ({row['best_bw']:.0%}) {best}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kv", choices=("bf16", "fp8", "both"), default="both", help="KV-cache dtype(s) to sweep")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    rows = [r for kv in (("bf16", "fp8") if args.kv == "both" else (args.kv,)) for r in sweep(kv)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
