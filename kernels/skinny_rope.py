"""Input RMSNorm + qkv skinny GEMM + rotary + KV-cache write in one launch, for decode steps.

The skinny decode layer's attention prologue was two launches: `rms_norm_linear_triton`
(kernels/skinny_gemm.py: qkv [M, (Hq + 2 Hk) D] = rmsnorm(x [+ residual]) * norm_weight @ w^T
(+ bias)) then `rotary_write_kv_triton` (kernels/rotary_cache.py: rope on the q and k heads of
qkv, k and v into the paged cache, q into a new [M, Hq, D]). Here rotation and stores are the
GEMM's epilogue, and qkv never reaches memory.

Columns: program p owns one head h of w's rows (Hq query heads, then Hk key heads, then Hk value
heads, D rows each: h = p // (D / BLOCK_N)) and a run of HB = BLOCK_N // 2 NeoX pairs (j, j + D/2),
j = j0 .. j0 + HB - 1, taken interleaved: column 2i is w row h D + j0 + i, column 2i + 1 is row
h D + j0 + i + D/2. Its fp32 accumulator (`_skinny_acc`: the plain kernel's loop and PDL wait,
PROLOGUE_RMS) [BLOCK_M, BLOCK_N], reshaped to [BLOCK_M, HB, 2], splits into the pairs' halves
(lo, hi). Grid: (Hq + 2 Hk) * D / BLOCK_N programs; no split-K (the epilogue needs whole sums).

Epilogue, rows m < M: + bias (fp32), then lo and hi rounded to x's dtype and back, where the
unfused GEMM stores qkv and the rotary kernel reads it back: with the same GEMM config the
outputs are bit-identical to the unfused pair. q and k heads rotate with the float32 table,
cos = cos_sin_cache[positions[m], j], sin = cos_sin_cache[positions[m], D/2 + j], as
rotary_cache.py does: (lo cos - hi sin, hi cos + lo sin) rounded to the dtype, evaluated with
the FMAs the compiler makes of that kernel's expressions (fma(lo, cos, -hi sin), fma(lo, sin,
hi cos)), written out here so that a different contraction cannot move the last bit. q heads go to
q[m, h]; k heads, and v heads unrotated, to cache[slot // block_size, slot % block_size, kv head]
for slot = slot_mapping[m] >= 0 (negative: skipped). Program 0 writes the new residual.

Scope: NeoX rope, no q/k norm (Qwen3), a KV cache in x's dtype or FP8 (k and v rounded to x's
dtype, then stored as rotary_cache.py stores them: `quantize_fp8` with k_scale / v_scale), head_dim
a power of two >= 16; the wrapper raises ValueError outside it, and the model keeps the unfused pair there
(Attention.fuses_rope). Config: skinny_tune.py's tuning under its own key ("rope", ...), its
candidates filtered by `rope_fits`; pdl exactly as the plain skinny kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import (
    FP8_KV_DTYPE, check_kv_scales, check_power_of_two, check_same_device, check_skinny_args, check_tensor,
)
from kernels.cache import quantize_fp8
from kernels.fp8_weight import Fp8Weight, unpack_weight
from kernels.skinny_acc import _skinny_acc, _w_scaled
from kernels.skinny_gemm import PROLOGUE_RMS
from kernels.skinny_tune import (
    MAX_M, SkinnyConfig, launch_constants, pick_config, rope_default_config, rope_fits,
)


@triton.jit
def _skinny_rope_kernel(
    x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, bias_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr,
    M, stride_x, stride_r, stride_nr, stride_w, stride_cos_sin, stride_q, stride_cb, stride_cs, stride_ch, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False, DOT: tl.constexpr = True, ws_ptr=None, W_SCALE: tl.constexpr = 0,
    k_scale_ptr=None, v_scale_ptr=None, FP8_KV: tl.constexpr = False,
):
    _rope_item(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, bias_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
               q_ptr, k_cache_ptr, v_cache_ptr, tl.program_id(0),
               M, stride_x, stride_r, stride_nr, stride_w, stride_cos_sin, stride_q, stride_cb, stride_cs, stride_ch,
               eps, K, TILES_PER_SPLIT, HAS_RESIDUAL, HAS_BIAS, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
               BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, USE_PDL, DOT, ws_ptr=ws_ptr, W_SCALE=W_SCALE,
               k_scale_ptr=k_scale_ptr, v_scale_ptr=v_scale_ptr, FP8_KV=FP8_KV)


@triton.jit
def _rope_item(
    x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, bias_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, pid,
    M, stride_x, stride_r, stride_nr, stride_w, stride_cos_sin, stride_q, stride_cb, stride_cs, stride_ch, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr, DOT: tl.constexpr, wait_ptr=None, wait_count=0, WAIT: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, REDUCE_EACH: tl.constexpr = False, ws_ptr=None, W_SCALE: tl.constexpr = 0,
    k_scale_ptr=None, v_scale_ptr=None, FP8_KV: tl.constexpr = False,
):
    """Program pid's work (the kernel's, and kernels/persistent_decode.py's work items; WAIT,
    PREFETCH and REDUCE_EACH: as in `_skinny_acc`; W_SCALE: an FP8 weight's, `_w_scaled`; FP8_KV:
    k and v stored as rotary_cache.py stores them in an FP8 cache, `quantize_fp8` of the rounded value)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    HB: tl.constexpr = BLOCK_N // 2
    RUNS: tl.constexpr = HALF // HB  # programs per head
    head = pid // RUNS
    j = (pid % RUNS) * HB + tl.arange(0, HB)  # this program's pairs (j, j + HALF)
    cols = tl.arange(0, BLOCK_N)
    offs_n = head * HEAD_DIM + (pid % RUNS) * HB + cols // 2 + (cols % 2) * HALF  # lo, hi interleaved
    acc = _skinny_acc(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, offs_n, cols < BLOCK_N, 0, pid == 0,
                      M, stride_x, stride_r, stride_nr, stride_w, eps, K, TILES_PER_SPLIT, 1,
                      HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, USE_PDL, DOT, wait_ptr, wait_count, WAIT,
                      PREFETCH, REDUCE_EACH)
    acc = _w_scaled(acc, ws_ptr, offs_n, cols < BLOCK_N, W_SCALE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
    dtype = x_ptr.dtype.element_ty
    acc = acc.to(dtype).to(tl.float32)  # the unfused GEMM's stored qkv, as the rotary kernel reads it
    lo, hi = tl.split(tl.reshape(acc, [BLOCK_M, HB, 2]))
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    if head < NUM_HEADS + NUM_KV_HEADS:  # q or k: rotate (rotary_cache.py's formula and order)
        pos = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        cs = cos_sin_ptr + pos[:, None] * stride_cos_sin + j[None, :]
        cos = tl.load(cs, mask=row_ok[:, None], other=0.0).to(tl.float32)
        sin = tl.load(cs + HALF, mask=row_ok[:, None], other=0.0).to(tl.float32)
        # the same explicit FMAs as rotary_cache.py (there: why), so both round alike
        out_lo = tl.fma(lo, cos, -(hi * sin)).to(dtype)
        out_hi = tl.fma(lo, sin, hi * cos).to(dtype)
    else:  # v: stored as the GEMM produced it
        out_lo = lo.to(dtype)
        out_hi = hi.to(dtype)
    if head < NUM_HEADS:
        q_dst = q_ptr + rows[:, None] * stride_q + head * HEAD_DIM + j[None, :]
        tl.store(q_dst, out_lo, mask=row_ok[:, None])
        tl.store(q_dst + HALF, out_hi, mask=row_ok[:, None])
    else:
        slot = tl.load(slot_ptr + rows, mask=row_ok, other=-1).to(tl.int64)
        ok = (row_ok & (slot >= 0))[:, None]
        kv_head = (head - NUM_HEADS) % NUM_KV_HEADS  # k heads, then v heads
        off = ((slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs)[:, None] \
            + kv_head * stride_ch + j[None, :]  # (k and v caches share their strides)
        if head < NUM_HEADS + NUM_KV_HEADS:
            if FP8_KV:
                out_lo, out_hi = _fp8_pair(out_lo, out_hi, k_scale_ptr, k_cache_ptr.dtype.element_ty)
            tl.store(k_cache_ptr + off, out_lo, mask=ok)
            tl.store(k_cache_ptr + off + HALF, out_hi, mask=ok)
        else:
            if FP8_KV:
                out_lo, out_hi = _fp8_pair(out_lo, out_hi, v_scale_ptr, v_cache_ptr.dtype.element_ty)
            tl.store(v_cache_ptr + off, out_lo, mask=ok)
            tl.store(v_cache_ptr + off + HALF, out_hi, mask=ok)


@triton.jit
def _fp8_pair(lo, hi, scale_ptr, cache_dtype: tl.constexpr):
    scale = tl.load(scale_ptr)
    return quantize_fp8(lo, scale).to(cache_dtype), quantize_fp8(hi, scale).to(cache_dtype)


def _check(x, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, n, num_heads, num_kv_heads,
           head_dim) -> dict:  # (an FP8 cache's scales: check_kv_scales)
    """Raises ValueError on arguments outside the kernel's scope; returns the tensors by name."""
    check_power_of_two("head_dim", head_dim, 16)
    if n != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"w has {n} rows, expected (num_heads + 2 * num_kv_heads) * head_dim "
                         f"= {(num_heads + 2 * num_kv_heads) * head_dim}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        check_tensor(name, t, 1, (torch.int32, torch.int64))
        if t.shape[0] != x.shape[0]:
            raise ValueError(f"{name} has {t.shape[0]} entries, x {x.shape[0]} rows")
    check_tensor("cos_sin_cache", cos_sin_cache, 2)
    if cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache row is {cos_sin_cache.shape[1]} wide, head_dim is {head_dim}")
    check_tensor("k_cache", k_cache, 4, (x.dtype, FP8_KV_DTYPE))
    check_tensor("v_cache", v_cache, 4, (k_cache.dtype,))
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and strides")
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"cache heads/dim {tuple(k_cache.shape[2:])} != {(num_kv_heads, head_dim)}")
    return dict(positions=positions, cos_sin_cache=cos_sin_cache, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=slot_mapping)


def rms_norm_qkv_rope_triton(
    x: torch.Tensor,  # [M, K], 1 <= M <= 16
    residual: torch.Tensor | None,  # [M, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    w: torch.Tensor | Fp8Weight,  # [(num_heads + 2 * num_kv_heads) * head_dim, K]: q | k | v rows
    bias: torch.Tensor | None,  # [(num_heads + 2 * num_kv_heads) * head_dim]
    positions: torch.Tensor,  # [M] int32/int64
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]: cos | sin halves
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] in x's dtype
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [M] int32/int64; < 0 skipped
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor | None = None,  # [1] float32: an FP8 cache's (kernels/cache.py), else ignored
    v_scale: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,  # None: tuned (CUDA) or rope_default_config
    pdl: bool = False,  # a programmatic dependent launch (compute capability 9.0+)
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_linear_triton then rotary_write_kv_triton (NeoX, no q/k norm) in one launch:
    returns (q [M, num_heads, head_dim] new and contiguous, new residual [M, K] or x itself);
    writes this step's k and v into the cache."""
    tensors = check_skinny_args(x, w, bias, residual, norm_weight, MAX_M)
    w, w_scale, w_scale_kind = unpack_weight(w)
    m, (n, k) = x.shape[0], w.shape
    tensors.update(_check(x, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, n, num_heads,
                          num_kv_heads, head_dim))
    fp8_kv = check_kv_scales(k_cache, k_scale, v_scale)
    check_same_device(**tensors)
    if config is not None and not rope_fits(config, head_dim):
        raise ValueError(f"{config} does not fit the fused rope kernel: split_k must be 1 and block_n a "
                         f"power of two in 2..head_dim ({head_dim})")
    q = torch.empty(m, num_heads, head_dim, device=x.device, dtype=x.dtype)
    new_residual = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x

    def run(cfg: SkinnyConfig) -> None:
        _skinny_rope_kernel[((num_heads + 2 * num_kv_heads) * (head_dim // cfg.block_n),)](
            x, r, norm_weight, new_residual, w, bias if bias is not None else w, positions, cos_sin_cache,
            slot_mapping, q, k_cache, v_cache,
            m, x.stride(0), r.stride(0), new_residual.stride(0), w.stride(0), cos_sin_cache.stride(0),
            q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), eps,
            HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, NUM_HEADS=num_heads,
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1], USE_PDL=pdl,
            ws_ptr=w_scale, W_SCALE=w_scale_kind, FP8_KV=fp8_kv,
            k_scale_ptr=k_scale if fp8_kv else None, v_scale_ptr=v_scale if fp8_kv else None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_constants(cfg, m, k),
            **({"launch_pdl": True} if pdl else {}),  # (the interpreter takes no launch_pdl)
        )

    if config is None:  # pdl or not: one config, so the same bits
        key = ("rope", bias is not None, triton.next_power_of_2(m), n, k, head_dim, x.dtype, w.dtype, w_scale_kind,
               x.device)
        config = pick_config(key, run, x.is_cuda, m, n, k, keep=lambda cfg: rope_fits(cfg, head_dim),
                             default=rope_default_config(m, n, k, head_dim))
    run(config)
    return q, new_residual
