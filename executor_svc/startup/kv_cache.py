"""KV-cache memory: how many blocks fit, and the per-layer tensors. Block 0 is the null block.

The cache dtype is the model's (--kv-cache-dtype auto) or float8_e4m3fn (fp8: half the bytes of
bf16, so twice the blocks in the same budget), with per-layer float32 K and V scales: the
checkpoint's (quantization/kv_scales.py) when it has them, else 1.0 (vLLM's default);
dequantized = fp8 * scale."""

from __future__ import annotations

import logging

import torch

from executor_svc.models.kv_cache import KVCache
from executor_svc.models.llama import ModelArgs

log = logging.getLogger(__name__)
_GIB = 1 << 30


KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn}  # --kv-cache-dtype values besides auto (config.py)


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the KV cache is stored in: the model's for "auto", else KV_CACHE_DTYPES's."""
    return model_dtype if kv_cache_dtype == "auto" else KV_CACHE_DTYPES[kv_cache_dtype]


def block_bytes(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over all layers (K and V), dtype being the cache's."""
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


def checkpoint_scales(kv_cache_dtype: str, model_scales: list[tuple[float, float]] | None,
                      model_dtype: torch.dtype) -> list[tuple[float, float]] | None:
    """The KV scales the caches get: the checkpoint's with --kv-cache-dtype fp8; none (1.0) with
    auto, as vLLM does (its KV-cache method forces 1.0 unless kv_cache_dtype is fp8: a 16/32-bit
    cache holds K and V as they are). Logs one line whenever the checkpoint has scales, and
    vLLM's warning when an FP8 cache runs on 1.0."""
    if model_scales is None:
        if kv_cache_dtype == "fp8":
            log.warning("FP8 KV cache with scales 1.0: the checkpoint has no k/v scales (small K/V values "
                        "lose precision; a calibrated checkpoint with a kv_cache_scheme carries them)")
        return None
    if kv_cache_dtype != "fp8":
        log.info("the checkpoint has FP8 KV-cache scales (kv_cache_scheme): not used, --kv-cache-dtype "
                 "%s keeps the KV cache in %s (pass --kv-cache-dtype fp8 to use them)", kv_cache_dtype, model_dtype)
        return None
    ks, vs = [k for k, _ in model_scales], [v for _, v in model_scales]
    log.info("FP8 KV cache with the checkpoint's per-layer scales (%d layers; k %.4g..%.4g, v %.4g..%.4g)",
             len(model_scales), min(ks), max(ks), min(vs), max(vs))
    return model_scales


def allocate_kv_caches(args: ModelArgs, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device, scales: list[tuple[float, float]] | None = None) -> list[KVCache]:
    """Per layer KVCache(k, v, k_scale, v_scale): k and v [num_blocks, block_size, num_kv_heads,
    head_dim] in dtype (the cache's), zeroed; the scales float32 [1] on the device (the kernels
    read them from there, so CUDA graphs see a later change): scales[layer] = (k, v), or 1.0."""
    shape = (num_blocks, block_size, args.num_kv_heads, args.head_dim)
    if scales is not None and len(scales) != args.num_layers:
        raise ValueError(f"{len(scales)} KV scale pairs for {args.num_layers} layers")

    def scale(value: float) -> torch.Tensor:
        return torch.tensor([value], dtype=torch.float32, device=device)

    pairs = scales if scales is not None else [(1.0, 1.0)] * args.num_layers
    return [KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                    scale(k), scale(v))
            for k, v in pairs]
