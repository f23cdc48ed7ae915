"""Argument checks shared by the Triton wrappers: each raises ValueError with a clear message."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(name: str, t: torch.Tensor, ndim: int, dtypes=FLOAT_DTYPES) -> None:
    """t has ndim dims, one of dtypes, and a contiguous last dim (vectorised row loads)."""
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {dtypes}, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise ValueError(f"tensors on different devices: { {k: str(t.device) for k, t in tensors.items()} }")


def check_power_of_two(name: str, n: int, minimum: int = 1) -> None:
    if n < minimum or n & (n - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {n}")


def check_paged_kv(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> tuple[int, int, int, int]:
    """Common checks of the attention kernels; returns (num_heads, num_kv_heads, head_dim, block_size)."""
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4, (q.dtype,))
    check_tensor("v_cache", v_cache, 4, (q.dtype,))
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache differ: {tuple(k_cache.shape)}/{k_cache.stride()} "
                         f"vs {tuple(v_cache.shape)}/{v_cache.stride()}")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    if q.shape[2] != head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} != cache head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} not a multiple of num_kv_heads {num_kv_heads}")
    if block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows, seq_lens {seq_lens.shape[0]}")
    check_power_of_two("head_dim", head_dim, 16)
    check_power_of_two("block_size", block_size, 8)
    return num_heads, num_kv_heads, head_dim, block_size
