"""Batch-invariant GEMM: y = x @ w.T (+ bias), each output row a function of its own input row.

cuBLAS picks its algorithm, tiles and split-K from the row count M, so a row's result depends
on how many rows share its step (issue 28). Here one compiled configuration serves every M:
fixed tiles (BLOCK_M x BLOCK_N, K walked in BLOCK_K steps from 0 up, in order), one `tl.dot`
shape, no split-K, fp32 accumulation, the bias added once at the end, then one rounding to the
output dtype. The row count changes only how many programs run, never how an element is summed:
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


@triton.jit(do_not_specialize=["M"])
def _linear_invariant_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
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
    for k0 in range(0, K, BLOCK_K):
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
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def linear_invariant_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] in x's dtype, or written into `out`
    ([M, N] with M = x's rows, any float dtype: one rounding from fp32)."""
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
    if m and n:
        grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N),)
        _linear_invariant_kernel[grid](
            x2, weight, bias if bias is not None else weight, out, m, n, k,
            x2.stride(0), weight.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return result if shape is None else result.reshape(shape)
