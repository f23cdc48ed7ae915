"""The host side of the persistent decode step (kernels/persistent_decode.py): the decoder's shape,
its table of per-layer addresses and the barrier counters a launch takes. No Triton here."""

from __future__ import annotations

from typing import NamedTuple

import torch

STAGES = 6  # a layer's stages (the kernel's LAYER_STAGES)
MAX_ROWS = 8  # a step's most rows
# layer_table's columns
WQKV, WO, WGU, WD, NORM1, NORM2, KCACHE, VCACHE = range(8)


class DecoderShape(NamedTuple):
    hidden: int
    intermediate: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


def layer_table(layers: list[tuple[torch.Tensor, ...]], shape: DecoderShape) -> torch.Tensor:
    """[L, 8] int64 device addresses of each layer's (qkv_w, o_w, gate_up_w, down_w, norm1_w,
    norm2_w, k_cache, v_cache), checked against `shape` and for 16-byte alignment. The caller keeps
    the tensors alive and builds the table again if any is replaced."""
    h, i, d = shape.hidden, shape.intermediate, shape.head_dim
    q, kv = shape.num_heads * d, shape.num_kv_heads * d
    want = ((q + 2 * kv, h), (h, q), (2 * i, h), (h, i), (h,), (h,))
    if len(layers) != shape.num_layers:
        raise ValueError(f"{len(layers)} layers given, the shape has {shape.num_layers}")
    dtype, device = layers[0][0].dtype, layers[0][0].device
    for n, tensors in enumerate(layers):
        for t, w in zip(tensors, want + (None, None)):
            if t.dtype != dtype or t.device != device or not t.is_contiguous():
                raise ValueError(f"layer {n}: every tensor must be contiguous {dtype} on {device}")
            if w is not None and tuple(t.shape) != w:
                raise ValueError(f"layer {n}: a tensor is {tuple(t.shape)}, expected {w}")
        k, v = tensors[KCACHE], tensors[VCACHE]
        if k.shape != v.shape or k.stride() != layers[0][KCACHE].stride() or tuple(k.shape[2:]) != (shape.num_kv_heads, d):
            raise ValueError(f"layer {n}: k/v caches must be [blocks, block_size, {shape.num_kv_heads}, {d}] alike")
    addresses = [[t.data_ptr() for t in tensors] for tensors in layers]
    if any(a % 16 for row in addresses for a in row):  # the kernel's loads assume it (vectorized)
        raise ValueError("every tensor of the layer table must start at a 16-byte aligned address")
    return torch.tensor(addresses, dtype=torch.int64, device=device)


def counters(shape: DecoderShape) -> int:
    """The int32 counters a launch takes: one for exits, one a barrier between two steps, then one
    a (row, kv head) counting its attention splits done (the last one merges them)."""
    return shape.num_layers * STAGES + 3 + MAX_ROWS * shape.num_kv_heads
