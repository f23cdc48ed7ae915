"""The paged KV cache of one layer, as the model reads and writes it (startup/kv_cache.py sizes and
allocates it)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class KVCache(NamedTuple):
    """One layer's paged cache: k, v [num_blocks, block_size, num_kv_heads, head_dim] (the model's
    dtype, or float8_e4m3fn with --kv-cache-dtype fp8) and the layer's FP8 scales, float32 [1]
    tensors on the cache's device (dequantized = fp8 * scale; 1.0 unless a checkpoint says
    otherwise; the kernels ignore them for a 16/32-bit cache)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
