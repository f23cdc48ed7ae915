"""Argument checks shared by the Triton wrappers: each raises ValueError with a clear message."""

from __future__ import annotations

import torch

from kernels.fp8_weight import FP8, Fp8Weight

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_KV_DTYPE = torch.float8_e4m3fn  # the one FP8 KV-cache dtype (vLLM's fp8 / fp8_e4m3)


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


def check_kv_scales(k_cache: torch.Tensor, k_scale: torch.Tensor | None,
                    v_scale: torch.Tensor | None) -> bool:
    """Whether k_cache is an FP8 cache; FP8 needs both scales (float32 tensors of one element on the
    cache's device, read by the kernels: no host sync, CUDA graphs see new values at replay). The
    scales of a 16/32-bit cache are ignored (not checked): it stores values as they are."""
    if k_cache.dtype != FP8_KV_DTYPE:
        return False
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            raise ValueError(f"an FP8 ({FP8_KV_DTYPE}) KV cache needs {name}: a float32 tensor of shape [1] "
                             "(dequantized value = fp8 * scale)")
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.numel() != 1:
            raise ValueError(f"{name} must be a float32 tensor of one element, got "
                             f"{getattr(s, 'dtype', type(s))} {tuple(getattr(s, 'shape', ()))}")
        if s.device != k_cache.device:
            raise ValueError(f"{name} is on {s.device}, the cache on {k_cache.device}")
    return True


def cache_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """The KV-cache dtypes allowed beside tensors of `dtype`: the same dtype, or FP8."""
    return (dtype, FP8_KV_DTYPE)


def check_paged_kv(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> tuple[int, int, int, int]:
    """Common checks of the attention kernels; returns (num_heads, num_kv_heads, head_dim, block_size)."""
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4, cache_dtypes(q.dtype))
    check_tensor("v_cache", v_cache, 4, (k_cache.dtype,))
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


def check_skinny_args(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                      norm_weight: torch.Tensor | None, max_rows: int, gated: bool = False) -> dict:
    """Raises ValueError on bad skinny GEMM arguments (kernels/skinny_gemm.py; gated: x is
    gate | up, 2K columns); returns the tensors given, by name."""
    check_tensor("x", x, 2)
    tensors = {"x": x}
    if isinstance(w, Fp8Weight):  # e4m3 with a per-tensor or per-channel scale (kernels/fp8_weight.py)
        check_tensor("w.q", w.q, 2, (FP8,))
        check_tensor("w.scale", w.scale, 1, (torch.float32,))
        if w.scale.shape[0] not in (1, w.q.shape[0]) or not w.scale.is_contiguous():
            raise ValueError(f"w.scale must be contiguous [1] or [{w.q.shape[0]}], got {tuple(w.scale.shape)}")
        tensors["w_scale"], w = w.scale, w.q
    else:
        check_tensor("w", w, 2, (x.dtype,))
    m, (n, k) = x.shape[0], w.shape
    if not 1 <= m <= max_rows:
        raise ValueError(f"skinny kernels take 1..{max_rows} rows, got {m}")
    a_cols = 2 * k if gated else k
    if x.shape[1] != a_cols:
        raise ValueError(f"x has {x.shape[1]} columns, weight {tuple(w.shape)} needs {a_cols}")
    tensors["w"] = w
    for name, t, size in (("bias", bias, n), ("norm_weight", norm_weight, k)):
        if t is not None:
            check_tensor(name, t, 1)
            if t.shape[0] != size:
                raise ValueError(f"{name} has {t.shape[0]} entries, expected {size}")
            tensors[name] = t
    if residual is not None:
        check_tensor("residual", residual, 2, (x.dtype,))
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        tensors["residual"] = residual
    return tensors
