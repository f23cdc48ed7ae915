"""Skinny GEMMs for decode steps: y[M, N] = a[M, K] @ W[N, K]^T (+ bias) for M <= MAX_M rows.

Decode-size linear layers are bound by reading W once. A program owns BLOCK_N output columns
and one of SPLIT_K runs of K tiles, streaming [BLOCK_N, BLOCK_K] W tiles coalesced along K;
splits write fp32 partials that `_split_reduce_kernel` sums in split order (no atomics: a
config gives bit-identical outputs call after call). A prologue builds the activation tile,
which removes the separate launches:
  PROLOGUE_NONE: a = x.
  PROLOGUE_RMS:  h = x (+ residual, rounded to x's dtype); a = rmsnorm(h) * norm_weight rounded
                 to x's dtype (kernels/norm.py's math). Every program first sums h^2 over the
                 row (K <= 8192: an L2 re-read); program (0, 0) writes h, the new residual.
  PROLOGUE_SILU: x = gate_up [M, 2K]; a = silu(gate) * up rounded to x's dtype (activation.py).
M == 1 runs a GEMV (fp32 products, reduced once at the end); 2 <= M <= 16 pad the rows to one
16-row `tl.dot` tile (the smallest tensor-core M, hence MAX_M = 16) or, with a config's
dot=False, run the GEMV's loop with a row axis (rows padded to a power of two; the tuner times
both). fp32 accumulation, IEEE products for fp32; K is a constexpr (a model has two). The
accumulation (`_skinny_acc`) is shared with the fused qkv + rope kernel (kernels/skinny_rope.py).

Config (kernels/skinny_tune.py): the first call of a (prologue, bias, M bucket, N, K, dtype) key
times CONFIGS in CUDA graphs with a cold L2 (kernel + split reduce) and caches the fastest. Tuning
syncs: it must run at warm-up, before capture; a key first met in a capture, or interpreted,
takes `default_config`. Then calls never sync and allocate by shape only: graph capturable.

pdl (Hopper): as a programmatic dependent launch the kernel may start while the one before it is
still running; it waits (`gdc_wait`) before reading anything a kernel writes and lets the next
one start once all its programs run (`gdc_launch_dependents`). Weights are never written by a
step, so the GEMV loads its first W tile before the wait. A launch with and without pdl shares its
key's config, so the two give the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_skinny_args, check_tensor
from kernels.grid_sync import grid_wait
from kernels.skinny_tune import (  # noqa: F401
    CONFIGS, MAX_M, SkinnyConfig, _cold_time_us, default_config, fits, launch_constants, pick_config,
)

PROLOGUE_NONE, PROLOGUE_RMS, PROLOGUE_SILU = 0, 1, 2


@triton.jit
def _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k, M, K, stride_x, stride_r,
            PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Raw inputs of an activation tile: (x or gate, residual or up, fp32 norm weight)."""
    mask = (rows[:, None] < M) & (offs_k[None, :] < K)
    ptrs = x_ptr + rows[:, None] * stride_x + offs_k[None, :]
    a = tl.load(ptrs, mask=mask, other=0.0)
    b = a
    nw = tl.zeros(offs_k.shape, dtype=tl.float32)
    if PROLOGUE == 1:
        if HAS_RESIDUAL:
            b = tl.load(r_ptr + rows[:, None] * stride_r + offs_k[None, :], mask=mask, other=0.0)
        nw = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    elif PROLOGUE == 2:
        b = tl.load(ptrs + K, mask=mask, other=0.0)
    return a, b, nw


@triton.jit
def _a_finish(a, b, nw, inv_rms, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] activation tile in x's dtype, prologue applied (zeros outside)."""
    dtype = a.dtype
    if PROLOGUE == 1:
        if HAS_RESIDUAL:
            a = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
        a = (a.to(tl.float32) * inv_rms[:, None] * nw[None, :]).to(dtype)
    elif PROLOGUE == 2:
        gate = a.to(tl.float32)
        a = (gate * tl.sigmoid(gate) * b.to(tl.float32)).to(dtype)
    return a


@triton.jit
def _gemv_term(w, a, REDUCE: tl.constexpr):
    """A GEMV tile's fp32 products w [BLOCK_N, BLOCK_K] * a [1, BLOCK_K], summed over K when REDUCE."""
    if REDUCE:
        return tl.sum(w.to(tl.float32) * a.to(tl.float32), axis=1)
    else:
        return w.to(tl.float32) * a.to(tl.float32)


@triton.jit
def _skinny_acc(
    x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, offs_n, n_mask, k_begin, store_residual,
    M, stride_x, stride_r, stride_nr, stride_w, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr, DOT: tl.constexpr, wait_ptr=None, wait_count=0, WAIT: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, REDUCE_EACH: tl.constexpr = False,
):
    """fp32 acc [BLOCK_M, BLOCK_N] of rows 0..M-1 for the W rows offs_n (any set of columns: the
    fused rope kernel interleaves them) over the K tiles from k_begin; the PDL wait included.
    store_residual: this program writes the new residual (PROLOGUE_RMS with a residual).
    WAIT (a persistent kernel's item): grid_wait(wait_ptr, wait_count) where the PDL wait is.
    PREFETCH (GEMV): W tile t + 1 is loaded before tile t's products (two tiles in flight, the
    second also before the wait); the same products summed in the same order: the same bits.
    REDUCE_EACH (GEMV): each tile's products summed over K at once into a [BLOCK_N] accumulator, not
    kept as a [BLOCK_N, BLOCK_K] one (other bits; the registers for large tiles in flight)."""
    rows = tl.arange(0, BLOCK_M)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    offs_k0 = k_begin + tl.arange(0, BLOCK_K)
    w0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=w_ptr.dtype.element_ty)
    if BLOCK_M == 1:  # the GEMV's first W tile: weights, never written by a step, so before the wait
        w0 = tl.load(w_rows + offs_k0[None, :], mask=n_mask[:, None] & (offs_k0[None, :] < K), other=0.0)
    w1 = w0
    if PREFETCH and BLOCK_M == 1 and TILES_PER_SPLIT > 1:  # (one tile: nothing to prefetch)
        w1 = tl.load(w_rows + offs_k0[None, :] + BLOCK_K, mask=n_mask[:, None] & (offs_k0[None, :] + BLOCK_K < K),
                     other=0.0)
    if USE_PDL:  # programmatic dependent launch: the previous kernel's outputs are visible past here
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if WAIT:
        grid_wait(wait_ptr, wait_count)
    if BLOCK_M == 1 and WAIT:  # a persistent GEMV's first activation tile in flight with the norm's loads
        xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k0, M, K, stride_x, stride_r,
                             PROLOGUE, HAS_RESIDUAL)
    inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1:  # sum of squares of the whole row; one program stores the new residual
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, NORM_BLOCK):
            offs_k = k0 + tl.arange(0, NORM_BLOCK)
            mask = (rows[:, None] < M) & (offs_k[None, :] < K)
            h = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(r_ptr + rows[:, None] * stride_r + offs_k[None, :], mask=mask, other=0.0)
                h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
                tl.store(nr_ptr + rows[:, None] * stride_nr + offs_k[None, :], h, mask=mask & store_residual)
            hf = h.to(tl.float32)
            sum_sq += tl.sum(hf * hf, axis=1)
        inv_rms = tl.rsqrt(sum_sq / K + eps)
    if BLOCK_M == 1:  # GEMV: elementwise products, one reduction at the end
        if not WAIT:
            xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k0, M, K, stride_x, stride_r,
                                 PROLOGUE, HAS_RESIDUAL)
        acc2 = _gemv_term(w0, _a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL), REDUCE_EACH)
        for t in range(1, TILES_PER_SPLIT if PREFETCH else 1):  # tile t + 1 in flight during tile t's products
            offs_k = k_begin + t * BLOCK_K + tl.arange(0, BLOCK_K)
            nxt = offs_k + BLOCK_K
            w2 = tl.load(w_rows + nxt[None, :], mask=n_mask[:, None] & (nxt[None, :] < K) & (t + 1 < TILES_PER_SPLIT),
                         other=0.0)
            xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k, M, K, stride_x, stride_r,
                                 PROLOGUE, HAS_RESIDUAL)
            acc2 += _gemv_term(w1, _a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL), REDUCE_EACH)
            w1 = w2
        for t in range(1, 1 if PREFETCH else TILES_PER_SPLIT):
            offs_k = k_begin + t * BLOCK_K + tl.arange(0, BLOCK_K)
            xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k, M, K, stride_x, stride_r,
                                 PROLOGUE, HAS_RESIDUAL)
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            acc2 += _gemv_term(w, _a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL), REDUCE_EACH)
        if REDUCE_EACH:
            acc = acc2[None, :]
        else:
            acc = tl.sum(acc2, axis=1)[None, :]
    elif not DOT:  # the GEMV's loop with a row axis: [BLOCK_M, BLOCK_N, BLOCK_K] fp32 partial sums
        acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        for t in range(TILES_PER_SPLIT):
            offs_k = k_begin + t * BLOCK_K + tl.arange(0, BLOCK_K)
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k, M, K, stride_x, stride_r,
                                 PROLOGUE, HAS_RESIDUAL)
            a = _a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL)
            acc3 += w.to(tl.float32)[None, :, :] * a.to(tl.float32)[:, None, :]
        acc = tl.sum(acc3, axis=2)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        offs_k = k_begin + tl.arange(0, BLOCK_K)
        xa, xb, nw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k, M, K, stride_x, stride_r,
                             PROLOGUE, HAS_RESIDUAL)
        for t in range(TILES_PER_SPLIT):  # the W loads are pipelined (num_stages), the a loads one ahead
            offs_k = k_begin + t * BLOCK_K + tl.arange(0, BLOCK_K)
            na, nb, nnw = _a_load(x_ptr, r_ptr, nw_ptr, rows, offs_k + BLOCK_K, M, K, stride_x, stride_r,
                                  PROLOGUE, HAS_RESIDUAL)
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            acc = tl.dot(_a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL), tl.trans(w), acc,
                         input_precision="ieee")
            xa, xb, nw = na, nb, nnw
    return acc


@triton.jit
def _skinny_kernel(
    x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, bias_ptr, y_ptr, part_ptr,
    M, N, stride_x, stride_r, stride_nr, stride_w, stride_y, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    NORM_BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False, DOT: tl.constexpr = True,
):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_begin = pid_k * TILES_PER_SPLIT * BLOCK_K  # this split's run of K tiles (masked past K)
    acc = _skinny_acc(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, offs_n, n_mask, k_begin, (pid_n == 0) & (pid_k == 0),
                      M, stride_x, stride_r, stride_nr, stride_w, eps, K, TILES_PER_SPLIT, PROLOGUE,
                      HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, USE_PDL, DOT)
    out_mask = (rows[:, None] < M) & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=out_mask)
    else:
        tl.store(part_ptr + (pid_k * M + rows[:, None]) * N + offs_n[None, :], acc, mask=out_mask)


@triton.jit
def _split_reduce_kernel(part_ptr, bias_ptr, y_ptr, M, N, stride_y,
                         HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr = False):
    """y[m, n] = sum over splits s = 0, 1, ... (in that order) of part[s, m, n] (+ bias)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + row) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(cfg: SkinnyConfig, prologue: int, x, residual, norm_weight, new_residual, w, bias, out, eps,
            pdl: bool = False):
    m, (n, k) = x.shape[0], w.shape
    launch = {"launch_pdl": True} if pdl else {}  # (the interpreter takes no launch_pdl)
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    part = torch.empty(cfg.split_k, m, n, device=x.device, dtype=torch.float32) if cfg.split_k > 1 else out
    r = residual if residual is not None else x
    _skinny_kernel[grid](
        x, r, norm_weight if norm_weight is not None else x, new_residual, w,
        bias if bias is not None else w, out, part,
        m, n, x.stride(0), r.stride(0), new_residual.stride(0), w.stride(0), out.stride(0), eps,
        PROLOGUE=prologue, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        SPLIT_K=cfg.split_k, USE_PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch_constants(cfg, m, k), **launch,
    )
    if cfg.split_k > 1:
        _split_reduce_kernel[(triton.cdiv(n, 1024), m)](
            part, bias if bias is not None else w, out, m, n, out.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, BLOCK=1024, USE_PDL=pdl, num_warps=4, **launch,
        )


def _skinny(prologue: int, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
            out: torch.Tensor | None, residual: torch.Tensor | None = None,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            config: SkinnyConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks arguments, picks a config, launches; returns (y, new_residual or x)."""
    tensors = check_skinny_args(x, w, bias, residual, norm_weight, MAX_M, gated=prologue == PROLOGUE_SILU)
    m, (n, k) = x.shape[0], w.shape
    if out is not None:
        check_tensor("out", out, 2, (x.dtype,))
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must be {(m, n)}, got {tuple(out.shape)}")
        tensors["out"] = out
    out = out if out is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    check_same_device(**tensors)
    new_residual = torch.empty_like(x) if residual is not None else x

    def run(cfg: SkinnyConfig) -> None:
        _launch(cfg, prologue, x, residual, norm_weight, new_residual, w, bias, out, eps, pdl)

    if config is None:
        key = (prologue, bias is not None, triton.next_power_of_2(m), n, k, x.dtype, x.device)  # pdl or not: one config
        config = pick_config(key, run, x.is_cuda, m, n, k)
    run(config)
    return out, new_residual


def skinny_linear_triton(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                         out: torch.Tensor | None = None, config: SkinnyConfig | None = None,
                         pdl: bool = False) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias [N]) -> [M, N] in x's dtype (written to `out` if given).
    pdl: launched as a programmatic dependent launch (Hopper; see the module's docstring)."""
    return _skinny(PROLOGUE_NONE, x, w, bias, out, config=config, pdl=pdl)[0]


def rms_norm_linear_triton(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                           eps: float, w: torch.Tensor, bias: torch.Tensor | None = None,
                           config: SkinnyConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x [+ residual]) * norm_weight) @ w^T (+ bias) -> (y [M, N], new residual [M, K])."""
    return _skinny(PROLOGUE_RMS, x, w, bias, None, residual, norm_weight, eps, config, pdl)


def silu_mul_linear_triton(gate_up: torch.Tensor, w: torch.Tensor,
                           config: SkinnyConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """(silu(gate_up[:, :I]) * gate_up[:, I:]) @ w [N, I]^T -> [M, N] in gate_up's dtype."""
    return _skinny(PROLOGUE_SILU, gate_up, w, None, None, config=config, pdl=pdl)[0]
