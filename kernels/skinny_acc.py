"""The skinny GEMMs' accumulation (kernels/skinny_gemm.py has the overview): a program's fp32
accumulator over its run of K tiles, the prologue (RMSNorm, SiLU * mul) building each activation
tile, shared by the plain kernel, the fused qkv + rope kernel (skinny_rope.py), the final norm +
lm_head (skinny_sample.py) and the persistent step's items (persistent_items.py). Weights are
16-bit or e4m3 (`Fp8Weight`: products in fp32, the scale applied by the caller's epilogue,
`_w_scaled`)."""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.grid_sync import grid_wait


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
            a = _a_finish(xa, xb, nw, inv_rms, PROLOGUE, HAS_RESIDUAL)  # (an e4m3 tile: exact in a's dtype)
            acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc,
                         input_precision="ieee")
            xa, xb, nw = na, nb, nnw
    return acc


@triton.jit
def _w_scaled(acc, ws_ptr, offs_n, n_mask, W_SCALE: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] times an FP8 weight's scale: W_SCALE 1 per tensor ([1]), 2 per output
    column ([N]); 0: a 16-bit weight, acc as is."""
    if W_SCALE == 1:
        acc = acc * tl.load(ws_ptr)
    elif W_SCALE == 2:
        acc = acc * tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    return acc
