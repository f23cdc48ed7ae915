"""Batch-invariant GEMM: y = x @ w.T (+ bias), each output row a function of its own input row.

cuBLAS picks its algorithm, tiles and split-K from the row count M, so a row's result depends
on how many rows share its step (issue 28). Here an element is always summed the same way for a
given weight: K's tiles (BLOCK_K wide) fall into `split_k` consecutive ranges (split_for: a
function of the weight's shape and the GPU, never of M); each range is summed from zero in
order by `tl.dot` with fp32 accumulation (BLOCK_K-deep steps; the output tile: below); the
range sums are added in order, ((r0 + r1) + r2) + ..., then the bias, then one rounding to the
output dtype. An element reads only its row of x and its row of w, through the same
instructions, whichever other rows share its tile (`M` is not specialized).

Two launches compute exactly that, and M picks between them (allowed: the bits are the same):
- few rows (the fused grid would leave SMs idle): program (tile, range) writes its range's fp32
  sum; `_sum_ranges_kernel` adds them in order, then the bias. More programs stream the weight
  (a decode step's GEMV), at the cost of writing and reading the partials.
- many rows: one program per tile walks every range in order, keeping the running total and the
  current range's sum in registers (no partials).
The output tile may change with M too (TILE_MANY from MANY_ROWS rows): an element is summed by
the same tl.dot k-steps whatever the tile, and the GPU test checks every tile gives the same bits.
The reference is `reference.linear_invariant_reference` (docs/deterministic.md).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor

BLOCK_K = 64  # K's tile: fixed (ranges are counted in it)
GROUP_M = 8  # programs walk GROUP_M row tiles per column band (L2 reuse; no effect on values)


class Tile(NamedTuple):
    """An output tile and its launch shape. Each element is summed over the same BLOCK_K tiles by
    the same tl.dot k-steps whatever the tile, so tiles may differ in bits only where the GPU's
    MMA instructions do: a tile serves some M only once the GPU shows it gives TILE's bits
    (benchmarks/invariant_bench.py; tests/kernels/test_batch_invariant.py)."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


TILE = Tile(64, 128, 4, 3)  # fewer than MANY_ROWS rows
# MANY_ROWS rows and more: 128-row tiles, two warp groups. On the H100 (docs/benchmarks.md, Runs AE)
# every tile of TILES gave TILE's bits on llama-1b's five weight shapes at 64, 256 and 2,048 rows;
# this one, at 256 and 2,048 rows, from 2% slower (qkv at 2,048) to 26% faster (lm_head at 2,048:
# 2,930 -> 2,164 µs), and slower at 64 rows.
TILE_MANY, MANY_ROWS = Tile(128, 128, 8, 3), 256
TILES = {"64x128": TILE, "128x128w8": TILE_MANY, "128x256w8": Tile(128, 256, 8, 3),
         "128x128w4": Tile(128, 128, 4, 3)}  # candidates measured by benchmarks/invariant_bench.py
BLOCK_N = TILE.block_n  # split_for counts one row tile's programs in TILE's columns
MAX_SPLIT_K = 16
MIN_RANGE_TILES = 4  # K tiles a range holds at least (split_for)
PROGRAMS_PER_SM = 2  # split_for fills the GPU with this many programs a SM at one row tile
SUM_BLOCK = 1024  # columns a program of the ranges' sum adds


@triton.jit
def _tile_dot(acc, x_rows, w_rows, m_mask, n_mask, K, k0, IEEE: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + the K tile at k0: [BLOCK_M, BLOCK_N] fp32."""
    k = k0 + tl.arange(0, BLOCK_K)
    k_mask = k < K
    a = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
    b = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if IEEE:  # float32 operands: full-precision products (not TF32)
        return tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc)


@triton.jit
def _range_sum(x_rows, w_rows, m_mask, n_mask, K, k_first, k_end,
               IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One range of K's tiles summed from zero, in order: [BLOCK_M, BLOCK_N] fp32."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_first, k_end, BLOCK_K):
        acc = _tile_dot(acc, x_rows, w_rows, m_mask, n_mask, K, k0, IEEE, BLOCK_K)
    return acc


@triton.jit
def _folded_ranges(x_rows, w_rows, m_mask, n_mask, K, range_tiles, SPLIT_K: tl.constexpr,
                   IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Every range in order as one K loop (one software pipeline, not one a range): a range's
    sum, from zero, folds into the total at its last tile — the first is the total, the next are
    added — then + 0.0 for the empty ranges the range sums add too: their bits exactly."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for t in range(0, k_tiles):
        acc = _tile_dot(acc, x_rows, w_rows, m_mask, n_mask, K, t * BLOCK_K, IEEE, BLOCK_K)
        if ((t + 1) % range_tiles == 0) | (t == k_tiles - 1):
            if t < range_tiles:
                total = acc
            else:
                total = total + acc
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if tl.cdiv(k_tiles, range_tiles) < SPLIT_K:
        total = total + 0.0
    return total


@triton.jit(do_not_specialize=["M"])
def _linear_invariant_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, range_tiles,
    stride_xm, stride_wn, stride_om, stride_or,
    SPLIT_K: tl.constexpr, PARTIALS: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_PDL: tl.constexpr = False, FOLD: tl.constexpr = False,
):
    if USE_PDL:  # a programmatic dependent launch (kernels/skinny_gemm.py): x is visible past here
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    span = range_tiles * BLOCK_K
    if PARTIALS:  # this program's range only, into out = the fp32 range sums [SPLIT_K, M, N]
        r = tl.program_id(1)
        total = _range_sum(x_rows, w_rows, m_mask, n_mask, K, r * span, tl.minimum(r * span + span, K),
                           IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        out_ptr += r.to(tl.int64) * stride_or
    else:  # every range in order, added as _sum_ranges_kernel adds them: ((r0 + r1) + r2) + ...
        if FOLD:  # as one K loop (benchmarks/invariant_bench.py until measured faster)
            total = _folded_ranges(x_rows, w_rows, m_mask, n_mask, K, range_tiles, SPLIT_K,
                                   IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        else:  # a K loop a range, in a runtime loop (unrolled over 16 ranges, the launch of
            # 2,048 rows x `down` took 5x the unsplit time: Runs AD)
            total = _range_sum(x_rows, w_rows, m_mask, n_mask, K, 0, tl.minimum(span, K),
                               IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
            for r in range(1, SPLIT_K):
                total += _range_sum(x_rows, w_rows, m_mask, n_mask, K, r * span, tl.minimum(r * span + span, K),
                                    IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M"])
def _sum_ranges_kernel(part_ptr, bias_ptr, out_ptr, M, N, stride_pr, stride_om,
                       SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                       USE_PDL: tl.constexpr = False):
    """out[m, n] = ((range 0 + range 1) + ...) + bias, then one rounding."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    ptr = part_ptr + row * N + offs
    acc = tl.load(ptr, mask=mask, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):
        ptr += stride_pr
        acc += tl.load(ptr, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_for(n: int, k: int, num_sms: int) -> int:
    """K's ranges for a [n, k] weight: doubled while one row tile's programs stay within
    PROGRAMS_PER_SM a SM and each range keeps MIN_RANGE_TILES tiles (never a function of M)."""
    tiles, k_tiles, split = triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K), 1
    while (2 * split <= MAX_SPLIT_K and tiles * 2 * split <= PROGRAMS_PER_SM * num_sms
           and k_tiles // (2 * split) >= MIN_RANGE_TILES):
        split *= 2
    return split


def linear_invariant_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            out: torch.Tensor | None = None, split_k: int | None = None,
                            partials: bool | None = None, tile: Tile | None = None, pdl: bool = False,
                            fold: bool = False) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T (+ bias [N]) -> [..., N] in x's dtype, or written into `out`
    ([M, N] with M = x's rows, any float dtype: one rounding from fp32). split_k: K's ranges
    (None: split_for the weight's shape on this GPU); partials: the launch (None: the range
    sums apart when one program a tile would leave SMs idle) — the same bits either way;
    tile: the output tile (None: TILE_MANY from MANY_ROWS rows, else TILE; TILES: candidates);
    pdl: both launches as programmatic dependent launches (Hopper; the same bits); fold: the
    one-program launch as one K loop (_folded_ranges; benchmarks only until measured)."""
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
    num_sms = _num_sms(x.device.index or 0) if x.is_cuda else 132
    split_k = split_for(n, k, num_sms) if split_k is None else split_k
    if not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {split_k}")
    if tile is None:
        tile = TILE_MANY if m >= MANY_ROWS else TILE
    tiles = triton.cdiv(m, tile.block_m) * triton.cdiv(n, tile.block_n)
    partials = split_k > 1 and tiles < num_sms if partials is None else partials and split_k > 1
    if m and n:
        range_tiles = triton.cdiv(triton.cdiv(k, BLOCK_K), split_k)  # (the last range may be short or empty)
        dummy = bias if bias is not None else weight
        target = torch.empty(split_k, m, n, dtype=torch.float32, device=x.device) if partials else out
        launch = {"launch_pdl": True} if pdl else {}  # (the interpreter takes no launch_pdl)
        _linear_invariant_kernel[(tiles, split_k if partials else 1)](
            x2, weight, dummy, target, m, n, k, range_tiles,
            x2.stride(0), weight.stride(0), target.stride(-2), target.stride(0) if partials else 0,
            SPLIT_K=split_k, PARTIALS=partials, HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
            USE_PDL=pdl, FOLD=fold, num_warps=tile.num_warps, num_stages=tile.num_stages, **launch)
        if partials:
            _sum_ranges_kernel[(m, triton.cdiv(n, SUM_BLOCK))](
                target, dummy, out, m, n, target.stride(0), out.stride(0),
                SPLIT_K=split_k, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK, USE_PDL=pdl, num_warps=4, **launch)
    return result if shape is None else result.reshape(shape)
