"""The persistent decode step (kernels/persistent_decode.py) alone, on CUDA: µs a step in CUDA-graph
replays at llama-1b's and SmolLM2's shapes (random bf16 weights, a 512-token context), for launch
variants, and the same launch with its barriers only (no stage's work): what the barriers cost.

    python -m benchmarks.persistent_bench [--shapes llama-1b,smollm2-135m-draft] [--rows 1 8] [--variants 0 5]

Compare with `python -m benchmarks.w4_ab --batches 1,8 [--persistent-decode]` (the whole step
through the executor, lm_head and sampling included)."""

from __future__ import annotations

import argparse

import torch

from benchmarks.skinny_bench import _graph_time_us
from executor_svc.model_loader.random_model import SHAPES
from kernels.persistent_decode import DecoderShape, counters, layer_table, persistent_decode_triton

CONTEXT, BLOCK = 512, 16
# (label, launch options); the defaults: one row's GEMV weight tiles of 32 KB, each summed over K at once, two in flight
VARIANTS = [("defaults", {}), ("16 KB tiles", dict(tile_bytes=16384)),
            ("64 KB tiles, one in flight", dict(tile_bytes=65536, prefetch=False)),
            ("the merge in a stage of its own", dict(merge_last=False)),
            ("K tiles of 256 kept [N, K] (before)", dict(block_k=256, reduce_each=False, prefetch=False)),
            ("barriers only", dict(barriers_only=True))]


def _tensors(name: str, rows: int):
    c = SHAPES[name]
    h, i, hq, hk = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim", h // hq)
    shape = DecoderShape(h, i, c["num_hidden_layers"], hq, hk, d)
    dev, bf = "cuda", torch.bfloat16
    blocks = rows * CONTEXT // BLOCK + 1

    def w(*size):
        return (torch.randn(*size, device=dev) * 0.02).to(bf)

    layers = [(w((hq + 2 * hk) * d, h), w(h, hq * d), w(2 * i, h), w(h, i), torch.ones(h, device=dev, dtype=bf),
               torch.ones(h, device=dev, dtype=bf), w(blocks, BLOCK, hk, d), w(blocks, BLOCK, hk, d))
              for _ in range(shape.num_layers)]
    tables = torch.arange(1, blocks, device=dev, dtype=torch.int32).reshape(rows, -1)
    step = dict(input_ids=torch.randint(0, c["vocab_size"], (rows,), device=dev),
                positions=torch.full((rows,), CONTEXT - 1, device=dev),
                slot_mapping=(tables[:, -1].long() * BLOCK + BLOCK - 1), block_tables=tables,
                seq_lens=torch.full((rows,), CONTEXT, device=dev, dtype=torch.int32),
                embed=w(c["vocab_size"], h), table=layer_table(layers, shape), final_norm=torch.ones(h, device=dev, dtype=bf),
                cos_sin_cache=torch.randn(CONTEXT, d, device=dev), k_cache=layers[0][6], shape=shape, eps=1e-5,
                barrier=torch.zeros(counters(shape), device=dev, dtype=torch.int32))
    return step, layers


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="llama-1b,smollm2-135m-draft")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--variants", type=int, nargs="+", default=None, help="indices into VARIANTS (default: all)")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}: µs a step (CUDA graphs), a stage's share, the bytes' rate")
    for name in args.shapes.split(","):
        for rows in args.rows:
            step, layers = _tensors(name, rows)
            shape = step["shape"]  # bytes a step reads: every weight, and k and v of each row's context
            stages = shape.num_layers * 6 + 2
            moved = sum(t.numel() * t.element_size() for layer in layers for t in layer[:6])
            moved += shape.num_layers * rows * CONTEXT * 2 * shape.num_kv_heads * shape.head_dim * 2
            for label, options in [VARIANTS[v] for v in args.variants] if args.variants else VARIANTS:
                try:
                    us = _graph_time_us([lambda: persistent_decode_triton(**step, **options)], reps=50)
                except ValueError as e:
                    print(f"{name} rows={rows} {label}: {e}", flush=True)
                    continue
                print(f"{name} rows={rows} {label}: {us:.1f} µs a step, {us / stages:.2f} µs a stage, "
                      f"{moved / us / 1e6:.2f} TB/s of weights and KV", flush=True)
            del step, layers
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
