"""KV-cache memory: how many blocks fit, and the per-layer tensors. Block 0 is the null block."""

from __future__ import annotations

import logging

import torch

from executor_svc.models.llama import KVCache, ModelArgs

log = logging.getLogger(__name__)
_GIB = 1 << 30


def block_bytes(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over all layers (K and V)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * args.num_layers * block_size * args.num_kv_heads * args.head_dim * elem


def num_blocks_from_budget(budget_bytes: int, args: ModelArgs, block_size: int,
                           dtype: torch.dtype) -> int:
    return max(0, int(budget_bytes) // block_bytes(args, block_size, dtype))


def cuda_kv_budget(device: torch.device, gpu_memory_utilization: float, peak_activation_bytes: int) -> int:
    """Bytes left for the KV cache: what is free now, minus the share we must leave unused and
    the activation peak of the largest step (measured by a profiling run)."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    reserve = (1.0 - gpu_memory_utilization) * total
    budget = int(free - reserve - peak_activation_bytes)
    log.info("GPU memory: %.1f GiB free of %.1f GiB, activation peak %.2f GiB, KV budget %.2f GiB",
             free / _GIB, total / _GIB, peak_activation_bytes / _GIB, budget / _GIB)
    return budget


def allocate_kv_caches(args: ModelArgs, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[KVCache]:
    """Per layer (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim], zeroed."""
    shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(args.num_layers)]
