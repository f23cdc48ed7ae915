"""Batch-invariant GEMM: y = x @ w.T (+ bias), each output row a function of its own input row.

cuBLAS picks its algorithm, tiles and split-K from the row count M, so a row's result depends
on how many rows share its step (issue 28). Here one compiled configuration serves every M:
fixed tiles (BLOCK_M x BLOCK_N, K walked in BLOCK_K steps from 0 up, in order), one `tl.dot`
shape, fp32 accumulation, the bias added once at the end, then one rounding to the output
dtype. A split of K (`split_k` > 1: each program sums one of split_k equal ranges of K tiles
into fp32 partials, a second kernel adds the partials in order 0..split_k-1, then the bias) is
allowed only as a function of the weight's shape, never of M: it changes the order in which an
element is summed, so every row count must use the same split for the same weight. The row count changes only how many programs run, never how an element is summed:
an output element reads only its row of x and its row of w, in the same order, through the same
instructions, whichever other rows share its tile (`M` is not specialized, so M == 1 compiles
nothing of its own). The cost is the decode rows: a step of 1..63 rows still runs 64-row tiles
(docs/deterministic.md). The reference is `reference.linear_invariant_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor

BLOCK_M, BLOCK_N, BLOCK_K = 64, 128, 64  # one configuration for every M: the invariance
GROUP_M = 8  # programs walk GROUP_M row tiles per column band (L2 reuse; no effect on values)
NUM_WARPS, NUM_STAGES = 4, 3
MAX_SPLIT_K = 16
SUM_BLOCK = 1024  # columns a program of the partials' sum adds


@triton.jit(do_not_specialize=["M"])
def _linear_invariant_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, k_tiles_per_split,
    stride_xm, stride_wn, stride_om, stride_os,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)  # (split_k > 1: out is the fp32 partials [split_k, M, N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = pid // (GROUP_M * num_n)  # GROUP_M row tiles x every column tile
    first_m = band * GROUP_M
    rows_in_band = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % rows_in_band
    pid_n = (pid % (GROUP_M * num_n)) // rows_in_band

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_first = split * k_tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_first + k_tiles_per_split * BLOCK_K, K)
    for k0 in range(k_first, k_end, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < K
        a = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if IEEE:  # float32 operands: full-precision products (not TF32)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + split.to(tl.int64) * stride_os + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M"])
def _sum_splits_kernel(part_ptr, bias_ptr, out_ptr, M, N, stride_ps, stride_om,
                       SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, n] = ((partial 0 + partial 1) + ...) + bias, in that order, then one rounding."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.load(part_ptr + row * N + offs, mask=mask, other=0.0)
    for s in range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * stride_ps + row * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def linear_invariant_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            out: torch.Tensor | None = None, split_k: int = 1) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] in x's dtype, or written into `out`
    ([M, N] with M = x's rows, any float dtype: one rounding from fp32). split_k: K's tiles in
    that many ranges summed apart, then in order (a function of the weight's shape only)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    check_tensor("x", x2, 2)
    check_tensor("weight", weight, 2, (x.dtype,))
    if weight.shape[1] != k:
        raise ValueError(f"weight must be [N, {k}] for x [..., {k}], got {tuple(weight.shape)}")
    n = weight.shape[0]
    if bias is not None:
        check_tensor("bias", bias, 1)
        if bias.shape[0] != n:
            raise ValueError(f"bias must have {n} entries, got {tuple(bias.shape)}")
    m = x2.shape[0]
    if out is None:
        result = out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        shape = (*x.shape[:-1], n)
    else:
        check_tensor("out", out, 2)
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out must be [{m}, {n}], got {tuple(out.shape)}")
        result, shape = out, None
    check_same_device(x=x2, weight=weight, out=out, **({} if bias is None else {"bias": bias}))
    if not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {split_k}")
    if m and n:
        k_tiles = triton.cdiv(triton.cdiv(k, BLOCK_K), split_k)  # each range's tiles (the last may be short)
        dummy = bias if bias is not None else weight
        target = out if split_k == 1 else torch.empty(split_k, m, n, dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N), split_k)
        _linear_invariant_kernel[grid](
            x2, weight, dummy, target, m, n, k, k_tiles,
            x2.stride(0), weight.stride(0), target.stride(-2), target.stride(0) if split_k > 1 else 0,
            HAS_BIAS=bias is not None and split_k == 1, IEEE=x.dtype == torch.float32,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
        if split_k > 1:
            _sum_splits_kernel[(m, triton.cdiv(n, SUM_BLOCK))](
                target, dummy, out, m, n, target.stride(0), out.stride(0),
                SPLIT_K=split_k, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK, num_warps=4)
    return result if shape is None else result.reshape(shape)
