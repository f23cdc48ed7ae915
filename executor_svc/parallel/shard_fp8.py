"""This rank's share of an FP8 projection (quantization/fp8.py Fp8Linear): the weight sliced as
the dense one is (parallel/shard.py), and its scales with it.

- column-parallel (qkv_proj and gate_up_proj parts: the rank's output rows): "channel" scales
  keep the rank's rows; "block" scales its block rows;
- row-parallel (o_proj, down_proj: the rank's input columns): "channel" scales whole (one per
  output row); "block" scales the rank's block columns;
- a per-tensor scale (one value, also a fused part's, repeated over its rows) is the same on
  every rank.

A block-wise checkpoint splits only where every shard boundary is a block boundary (check_blocks:
ModelError otherwise; the end of the whole dimension may end a partial block). --quantization fp8
quantizes each dense weight per output channel over its whole row before slicing, so every rank
holds the single-device model's fp8 values and scales (a row-parallel shard's own amax would
give other scales than one device). Checkpoint KV-cache scales are one value per layer: the same
on every rank, which holds its KV heads (kv_scales.py)."""

from __future__ import annotations

import torch

from executor_svc.model_loader.checks import ModelError
from executor_svc.parallel import shard
from executor_svc.parallel.state import TensorParallel
from executor_svc.quantization import fp8

# (our parameter of layer 0, part) of every sliced projection tensor
_PIECES = [("layers.0.self_attn.qkv_proj.weight", p) for p in range(3)] + [
    ("layers.0.mlp.gate_up_proj.weight", p) for p in range(2)] + [
    ("layers.0.self_attn.o_proj.weight", None), ("layers.0.mlp.down_proj.weight", None)]
_PART_NAMES = {("qkv_proj", 0): "q_proj", ("qkv_proj", 1): "k_proj", ("qkv_proj", 2): "v_proj",
               ("gate_up_proj", 0): "gate_proj", ("gate_up_proj", 1): "up_proj"}


def check_blocks(args, tp: TensorParallel, block: tuple[int, int]) -> None:
    """ModelError (one line) when this rank's slice of a projection starts, or ends before the
    end of the dimension, inside a (bn, bk) block of weight_block_size."""
    if tp.size == 1:
        return
    for name, part in _PIECES:
        dim, start, stop, length = shard.shard_slice(name, part, args, tp)
        size = block[dim]
        bad = start if start % size else stop if stop % size and stop != length else None
        if bad is not None:
            module = name.split(".")[-2]
            what = _PART_NAMES.get((module, part), module)
            axis = "rows" if dim == 0 else "columns"
            raise ModelError(f"--tensor-parallel-size {tp.size} splits a weight_block_size {list(block)} block of "
                             f"{what}: rank {tp.rank}'s {axis} [{start}, {stop}) of {length} do not start and end on "
                             f"multiples of {size} (serve this checkpoint with fewer ranks)")


def rank_scale(name: str, part: int | None, scale: torch.Tensor, strategy: str,
               block: tuple[int, int] | None, args, tp: TensorParallel) -> torch.Tensor:
    """The rank's slice of a checkpoint scale of parameter `name` (part of a fused one, or None)."""
    bounds = shard.shard_slice(name, part, args, tp) if tp.size > 1 else None
    if bounds is None or scale.numel() == 1:
        return scale
    dim, start, stop, _ = bounds
    if strategy == "block":  # check_blocks: start and stop on block boundaries (or the end)
        lo, hi = start // block[dim], -(-stop // block[dim])
        return scale[lo:hi] if dim == 0 else scale[:, lo:hi]
    return scale[start:stop] if dim == 0 else scale  # per output row: row-parallel keeps all


def load(module: fp8.Fp8Linear, leaf: str, tensor: torch.Tensor, rows: tuple[int, int] | None,
         quantize: bool, name: str, part: int | None, args, tp: TensorParallel, where: str) -> list[str]:
    """Fp8Linear.load of the rank's share of a checkpoint weight or scale (leaf: its name in the
    checkpoint); with `quantize` (--quantization fp8), a dense weight quantized before slicing."""
    kind = fp8.SCALE_NAMES.get(leaf, leaf)
    if tp.size == 1 or (quantize and (kind != "weight" or tensor.dtype.itemsize == 1)):
        return module.load(kind, tensor, rows, quantize, where)  # (the latter: refused there)
    if quantize:
        weight, scale = fp8.quantize_per_channel(tensor)
        filled = module.load("weight", shard.shard_tensor(name, part, weight, args, tp), rows, False, where)
        scale = rank_scale(name, part, scale, "channel", None, args, tp)
        return filled + module.load("weight_scale", scale, rows, False, where)
    if kind == "weight":
        return module.load(kind, shard.shard_tensor(name, part, tensor, args, tp), rows, False, where)
    scale = rank_scale(name, part, tensor, module.strategy, module.block, args, tp)
    return module.load(kind, scale, rows, False, where)
