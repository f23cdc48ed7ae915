"""The rotary + KV-write kernel (kernels/rotary_cache.py) per launch, on CUDA.

    python -m benchmarks.rotary_bench [--tokens 1 8 64 256 2048]

For llama-1b's heads (32 q, 8 kv, head_dim 64), SmolLM2's (9, 3, 64) and an 8B's (32, 8, 128):
µs a launch (triton.testing.do_bench_cudagraph: CUDA-graph replays, as the server runs steps)
and GB/s of the bytes it must move (qkv read; q, k and v written). Run in two trees (this one and
an export of the commit before) for an A-B: the kernel's grid changed from a program a head to two
programs a token (issue 27)."""

from __future__ import annotations

import argparse

import torch

HEADS = {"llama-1b": (32, 8, 64), "smollm2": (9, 3, 64), "8b": (32, 8, 128)}
BLOCK = 16


def main() -> None:
    import triton.testing

    from kernels.rotary_cache import rotary_write_kv_triton

    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 2048])
    args = p.parse_args()
    dev, dtype = "cuda", torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, {dtype}; µs a launch (CUDA graphs)")
    for name, (hq, hk, d) in HEADS.items():
        cos_sin = torch.randn(8192, d, device=dev)
        for t in args.tokens:
            qkv = torch.randn(t, (hq + 2 * hk) * d, device=dev, dtype=dtype)
            positions = torch.randint(0, 8192, (t,), device=dev, dtype=torch.int32)
            blocks = t // BLOCK + 2
            k = torch.empty(blocks, BLOCK, hk, d, device=dev, dtype=dtype)
            v = torch.empty_like(k)
            slots = torch.randperm(blocks * BLOCK, device=dev)[:t].to(torch.int32)
            out = torch.empty(t, hq, d, device=dev, dtype=dtype)
            us = 1e3 * triton.testing.do_bench_cudagraph(
                lambda: rotary_write_kv_triton(positions, qkv, cos_sin, k, v, slots, hq, hk, d, out=out))
            moved = qkv.numel() * 2 + (out.numel() + 2 * t * hk * d) * 2
            print(f"ROTARY {name:9s} T={t:5d} {us:8.2f} us {moved / us / 1e3:8.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
