"""The batch-invariant GEMM (kernels/gemm_invariant.py) against cuBLAS on llama-1b's shapes, per
row count: how each launch, tile and split of K performs (--deterministic's cost).

    python -m benchmarks.invariant_bench [--json FILE] [--splits] [--all-tiles]

Every figure is a CUDA graph's replay (triton.testing.do_bench_cudagraph), as the server runs
steps (eager launches measure the host at few rows: Runs AD). Per shape and M: the weight-read
floor at 4.8 TB/s (the H200's; an H100 has 3.35), cuBLAS µs, the invariant kernel's µs as the
model runs it (`auto`: the shape's split_for, M's tile and launch); --splits: also split_k
1..16 through the range sums apart. Then, at 64 rows and more, TILE and TILE_MANY (--all-tiles:
every candidate of gemm_invariant.TILES) with the shape's split through each launch (one
program a tile walking the ranges, that program as one folded K loop, the range sums apart): µs,
and whether the output has TILE's bits (a tile or launch may serve some M only if it does)."""

from __future__ import annotations

import argparse
import json

import torch

SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
          "lm_head": (128256, 2048)}
ROWS = (1, 8, 64, 256, 2048)
SPLITS = (1, 2, 4, 8, 16)


def main() -> None:
    import triton.testing

    from kernels.gemm_invariant import TILE, TILE_MANY, TILES, linear_invariant_triton

    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--splits", action="store_true", help="also every split of K through the range sums")
    p.add_argument("--all-tiles", action="store_true", help="every candidate tile (default: TILE, TILE_MANY)")
    args = p.parse_args()
    tiles = TILES if args.all_tiles else {name: t for name, t in TILES.items() if t in (TILE, TILE_MANY)}
    out = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"shape": name, "m": m, "floor_us": (n * k * 2 + m * (k + n) * 2) / 4.8e12 * 1e6,
                   "cublas_us": 1e3 * triton.testing.do_bench_cudagraph(lambda: torch.nn.functional.linear(x, w))}
            row["auto_us"] = 1e3 * triton.testing.do_bench_cudagraph(lambda: linear_invariant_triton(x, w))
            for s in SPLITS if args.splits else ():  # (range sums over 2 GB: not measured)
                row[f"split{s}_us"] = float("nan") if s * m * n * 4 > 2**31 else 1e3 * triton.testing.do_bench_cudagraph(
                    lambda: linear_invariant_triton(x, w, split_k=s, partials=s > 1))
            out.append(row)
            print(f"{name:8s} m={m:5d} floor {row['floor_us']:7.1f} cublas {row['cublas_us']:7.1f} "
                  f"auto {row['auto_us']:7.1f} | " + " ".join(f"s{s} {row[f'split{s}_us']:7.1f}" for s in SPLITS if f"split{s}_us" in row),
                  flush=True)
            if m >= 64:  # each tile through each launch (one program a tile; the range sums apart)
                ref = linear_invariant_triton(x, w, tile=TILE)
                cells = []
                for tname, tile in tiles.items():
                    for launch, partials, fold in (("one", False, False), ("fold", False, True), ("sums", True, False)):
                        if partials and m * n * 4 * 16 > 2**31:
                            continue
                        same = torch.equal(linear_invariant_triton(x, w, tile=tile, partials=partials, fold=fold), ref)
                        us = 1e3 * triton.testing.do_bench_cudagraph(
                            lambda: linear_invariant_triton(x, w, tile=tile, partials=partials, fold=fold))
                        row[f"tile_{tname}_{launch}"] = {"us": us, "same_bits": same}
                        cells.append(f"{tname} {launch} {us:7.1f}{'' if same else ' DIFFERS'}")
                print(f"{name:8s} m={m:5d} tiles | " + " | ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
