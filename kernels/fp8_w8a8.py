"""The w8a8 half of the FP8 GEMMs (kernels/fp8_gemm.py has the overview and the dispatch):
dynamic activation quantization (`_quant_kernel`: per token, or per token and bk group, scale =
max(amax / 448, FP8_MIN_SCALE), IEEE division, e4m3 round to nearest even, as
kernels/fp8_reference.py) and the FP8 tensor-core GEMM: `torch._scaled_mm` with rowwise scales
(scale_a [M, 1], scale_b [1, N] float32; bf16 output, N and K multiples of 16, tensor / channel
weights) or `_w8a8_kernel` (any of the three; grouped launch order, fp8 tl.dot per K tile
promoted to fp32 and scaled per (token group, weight block), split-K partials summed in split
order by skinny_gemm's `_split_reduce_kernel`). Up to W8A8_TUNE_MAX_M rows the GEMM is tuned at
first use outside capture (W8A8_CONFIGS and, where it applies, `_scaled_mm`, timed cold in
graphs), per (strategy, block, bias, next_pow2(M), N, K, dtype); beyond, or untuned,
`_scaled_mm` where it applies, else `w8a8_default_config`. Also the argument checks shared with the w8a16 kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor
from kernels.fp8_reference import (
    FP8,
    FP8_MIN_SCALE,
    Fp8Activation,
    activation_group_size,
    pow2_divisor,
)
from kernels.skinny_gemm import _split_reduce_kernel
from kernels.skinny_tune import _cold_time_us

STRATEGIES = {"tensor": 0, "channel": 1, "block": 2}


class W8A8Config(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1


SCALED_MM = "scaled_mm"  # the tuner's other candidate (bf16, tensor / channel weights, N and K % 16 == 0)
# decode batches (64..512 rows) leave a [128, 128]-tile grid of a few dozen programs on llama-1b's
# o and down projections: narrower tiles and split-K fill the SMs
W8A8_CONFIGS = (
    W8A8Config(64, 64, 128, 4, 4), W8A8Config(64, 128, 128, 4, 4), W8A8Config(64, 64, 256, 4, 3),
    W8A8Config(64, 128, 128, 4, 4, 2), W8A8Config(64, 64, 128, 4, 4, 4), W8A8Config(64, 128, 256, 8, 3, 2),
    W8A8Config(128, 64, 128, 4, 4), W8A8Config(128, 128, 128, 8, 3), W8A8Config(128, 128, 128, 8, 3, 2),
    W8A8Config(128, 64, 128, 4, 4, 4), W8A8Config(128, 256, 128, 8, 3), W8A8Config(128, 128, 256, 8, 3),
)
W8A8_TUNE_MAX_M = 512  # tuned up to here (decode); prefill shapes take the default choice
W8A8_SPLIT_TARGET = 132  # the default splits K until the grid has about one program per H100 SM
_tuned: dict[tuple, W8A8Config | str] = {}


@triton.jit
def _quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s, min_scale,
                  GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, g): columns [g * GROUP, (g + 1) * GROUP) of one row -> e4m3 and their scale."""
    row, g = tl.program_id(0), tl.program_id(1)
    offs = g * GROUP + tl.arange(0, BLOCK)
    mask = (tl.arange(0, BLOCK) < GROUP) & (offs < K)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), 448.0), min_scale)
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
    tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_s + g, scale)


@triton.jit
def _w8a8_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, y_ptr, part_ptr, M, N,
                 stride_a, stride_as, stride_w, stride_ws_n, stride_y, K: tl.constexpr,
                 GROUPED: tl.constexpr, BN_SCALE: tl.constexpr, BK_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 TILES_PER_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr):
    """fp8 A [M, K] x fp8 W [N, K]^T over the K tiles of split program_id(1); each K tile's tl.dot
    is promoted to fp32 (and, GROUPED, scaled by its activation group and weight block scales);
    ungrouped scales apply at the end. SPLIT_K > 1: fp32 partials [SPLIT_K, M, N] in part_ptr."""
    pid, pid_k = tl.program_id(0), tl.program_id(1)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n  # grouped order: GROUP_M row tiles share each W column tile in L2
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m, pid_n = first_m + (pid % width) % size_m, (pid % width) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_first = pid_k * TILES_PER_SPLIT * BLOCK_K
    m_mask, n_mask = offs_m < M, offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_a + (k_first + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w + (k_first + offs_k)[None, :]
    as_rows = as_ptr + offs_m * stride_as
    ws_rows = ws_ptr + (offs_n // BN_SCALE) * stride_ws_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for t in range(TILES_PER_SPLIT):
        k0 = k_first + t * BLOCK_K
        k_mask = offs_k < K - k0  # (a last split's tiles past K: all masked, a zero product)
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        part = tl.dot(a, tl.trans(w))
        if GROUPED:
            g = k0 // BK_SCALE
            sa = tl.load(as_rows + g, mask=m_mask & (k0 < K), other=0.0)
            sw = tl.load(ws_rows + g, mask=n_mask & (k0 < K), other=0.0)
            acc += part * sa[:, None] * sw[None, :]
        else:
            acc += part
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not GROUPED:
        sa = tl.load(as_rows, mask=m_mask, other=0.0)
        sw = tl.load(ws_rows, mask=n_mask, other=0.0)
        acc = acc * sa[:, None] * sw[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=out_mask)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :], acc, mask=out_mask)


def check_fp8_args(x, weight, scale, strategy, block, bias, out=None) -> None:
    check_tensor("x", x, 2)
    tensors = _check_weight(x.shape[1], weight, scale, strategy, block, bias)
    n = weight.shape[0]
    tensors["x"] = x
    if out is not None:
        check_tensor("out", out, 2, (x.dtype,))
        if tuple(out.shape) != (x.shape[0], n):
            raise ValueError(f"out must be {(x.shape[0], n)}, got {tuple(out.shape)}")
        tensors["out"] = out
    check_same_device(**tensors)


def _check_weight(k_in: int, weight, scale, strategy, block, bias) -> dict:
    """The weight, its scales and the bias for an input of k_in columns; returns them by name."""
    check_tensor("weight", weight, 2, (FP8,))
    check_tensor("weight_scale", scale, scale.dim(), (torch.float32,))
    n, k = weight.shape
    if k_in != k:
        raise ValueError(f"x has {k_in} columns, weight {tuple(weight.shape)} needs {k}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown FP8 weight strategy {strategy!r}")
    want = {"tensor": (1,), "channel": (n,)}.get(strategy) or (-(-n // block[0]), -(-k // block[1]))
    if tuple(scale.shape) != want or not scale.is_contiguous():
        raise ValueError(f"{strategy} weight_scale must be contiguous {want}, got {tuple(scale.shape)}")
    tensors = {"weight": weight, "weight_scale": scale}
    if bias is not None:
        check_tensor("bias", bias, 1)
        if bias.shape[0] != n:
            raise ValueError(f"bias has {bias.shape[0]} entries, expected {n}")
        tensors["bias"] = bias
    return tensors


def check_fp8_activation(x: Fp8Activation, weight, scale, strategy, block, bias) -> None:
    """Pre-quantized activations: q [M, K] e4m3 and scale [M, ceil(K / group)] float32 as the
    weight's strategy groups them, dtype a 16/32-bit float (the output's)."""
    check_tensor("x.q", x.q, 2, (FP8,))
    check_tensor("x.scale", x.scale, 2, (torch.float32,))
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x.dtype must be fp16, bf16 or fp32, got {x.dtype}")
    m, k = x.q.shape
    tensors = _check_weight(k, weight, scale, strategy, block, bias)
    groups = triton.cdiv(k, activation_group_size(strategy, block, k))
    if tuple(x.scale.shape) != (m, groups) or not x.scale.is_contiguous():
        raise ValueError(f"x.scale must be contiguous {(m, groups)} for {strategy} weights, got {tuple(x.scale.shape)}")
    check_same_device(q=x.q, scale=x.scale, **tensors)


def quantize_activations_triton(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales [M, ceil(K / group_size)]), as the reference."""
    check_tensor("x", x, 2)
    m, k = x.shape
    groups = triton.cdiv(k, group_size)
    q = torch.empty(m, k, device=x.device, dtype=FP8)
    scales = torch.empty(m, groups, device=x.device, dtype=torch.float32)
    if m:
        block = triton.next_power_of_2(group_size)
        _quant_kernel[(m, groups)](x, q, scales, k, x.stride(0), q.stride(0), scales.stride(0), FP8_MIN_SCALE,
                                   GROUP=group_size, BLOCK=block, num_warps=max(1, min(16, block // 512)))
    return q, scales


def w8a8_fits(cfg: W8A8Config, k: int, k_tile_max: int) -> bool:
    """Usable here: BLOCK_K within the K tile the scales allow (block weights: a divisor of bk) and
    each split >= 2 K tiles."""
    return cfg.block_k <= k_tile_max and (cfg.split_k == 1 or triton.cdiv(k, cfg.block_k) >= 2 * cfg.split_k)


def w8a8_default_config(m: int, n: int, k: int, k_tile_max: int = 128) -> W8A8Config:
    """The untuned choice: 64-row tiles up to 64 rows, then 128 x 128, K tiles of up to 128, and
    split-K doubling (up to 4) while the grid is under W8A8_SPLIT_TARGET programs and each split
    keeps >= 4 K tiles (llama-1b at 256 rows: qkv, o and down split 4, gate_up 1); none past
    W8A8_TUNE_MAX_M rows, so prefill sizes compile two variants, not one per grid size."""
    bk = min(128, k_tile_max)
    cfg = W8A8Config(64, 128, bk, 4, 4) if m <= 64 else W8A8Config(128, 128, bk, 8, 3)
    tiles, k_tiles, split = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), triton.cdiv(k, cfg.block_k), 1
    while m <= W8A8_TUNE_MAX_M and tiles * split < W8A8_SPLIT_TARGET and split < 4 and k_tiles >= 8 * split:
        split *= 2
    return cfg._replace(split_k=split)


def w8a8_linear_triton(x: torch.Tensor | Fp8Activation, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                       block: tuple[int, int] | None = None, bias: torch.Tensor | None = None,
                       backend: str = "auto", config: W8A8Config | None = None) -> torch.Tensor:
    """Dynamic per-token (per-group for block weights) activation quantization + an FP8 tensor-core
    GEMM. backend: "scaled_mm" (tensor / channel), "triton" (`config`, else the tuned or default
    Triton config), or "auto": the tuned choice of both up to W8A8_TUNE_MAX_M rows, beyond it
    scaled_mm where it applies. x may be an Fp8Activation, quantized already
    (kernels/fp8_fused.py): no quantization launch."""
    quantized = isinstance(x, Fp8Activation)
    if quantized:
        check_fp8_activation(x, weight, scale, strategy, block, bias)
    else:
        check_fp8_args(x, weight, scale, strategy, block, bias)
    dtype = x.dtype
    m, (n, k) = (x.q if quantized else x).shape[0], weight.shape
    group = activation_group_size(strategy, block, k)
    if strategy == "block" and pow2_divisor(group, 1 << 30) < 32:
        raise ValueError(f"block {tuple(block)}: bk needs a power-of-two divisor >= 32")
    scaled_mm_fits = strategy != "block" and dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0
    if backend == "scaled_mm" and not scaled_mm_fits:
        raise ValueError("torch._scaled_mm takes bf16 tensor / channel weights with N and K multiples of 16 here")
    if backend not in ("auto", "triton", SCALED_MM):
        raise ValueError(f"unknown w8a8 backend {backend!r}")
    q, x_scale = (x.q, x.scale) if quantized else quantize_activations_triton(x, group)
    grouped = strategy == "block"
    bn, bk = block if grouped else (1, 1)
    k_tile_max = pow2_divisor(bk, 256) if grouped else 256
    stride_ws = scale.stride(0) if grouped else (0 if strategy == "tensor" else 1)

    def run(choice: W8A8Config | str) -> torch.Tensor:
        if choice == SCALED_MM:
            w_scale = scale.expand(n).reshape(1, n).contiguous()  # tensor: the scalar on every column
            out = torch._scaled_mm(q, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=dtype)
            return out.add_(bias) if bias is not None else out
        tiles = triton.cdiv(triton.cdiv(k, choice.block_k), choice.split_k)
        y = torch.empty(m, n, device=weight.device, dtype=dtype)
        part = torch.empty(choice.split_k, m, n, device=y.device, dtype=torch.float32) if choice.split_k > 1 else y
        _w8a8_kernel[(triton.cdiv(m, choice.block_m) * triton.cdiv(n, choice.block_n), choice.split_k)](
            q, x_scale, weight, scale, bias if bias is not None else scale, y, part, m, n,
            q.stride(0), x_scale.stride(0), weight.stride(0), stride_ws, y.stride(0), K=k,
            GROUPED=grouped, BN_SCALE=bn, BK_SCALE=bk, HAS_BIAS=bias is not None,
            BLOCK_M=choice.block_m, BLOCK_N=choice.block_n, BLOCK_K=choice.block_k, GROUP_M=8,
            TILES_PER_SPLIT=tiles, SPLIT_K=choice.split_k, num_warps=choice.num_warps, num_stages=choice.num_stages)
        if choice.split_k > 1:
            _split_reduce_kernel[(triton.cdiv(n, 1024), m)](
                part, bias if bias is not None else scale, y, m, n, y.stride(0),
                HAS_BIAS=bias is not None, SPLIT_K=choice.split_k, BLOCK=1024, num_warps=4)
        return y

    if m == 0:
        return torch.empty(0, n, device=weight.device, dtype=dtype)
    if backend == SCALED_MM or config is not None:
        return run(SCALED_MM if backend == SCALED_MM else config)
    with_scaled_mm = backend == "auto" and scaled_mm_fits
    default = SCALED_MM if with_scaled_mm else w8a8_default_config(m, n, k, min(128, k_tile_max))
    if m > W8A8_TUNE_MAX_M or not q.is_cuda:
        return run(default)
    key = (strategy, tuple(block) if block else None, bias is not None, triton.next_power_of_2(m), n, k, dtype,
           q.device, with_scaled_mm)
    if key not in _tuned and not torch.cuda.is_current_stream_capturing():
        flush = torch.empty(max(torch.cuda.get_device_properties(q.device).L2_cache_size, 32 << 20),
                            dtype=torch.float16, device=q.device)  # reads that push the weights out of L2
        candidates = [c for c in W8A8_CONFIGS if w8a8_fits(c, k, k_tile_max)] + ([SCALED_MM] if with_scaled_mm else [])
        timings = {c: _time_or_inf(run, c, flush) for c in candidates}
        _tuned[key] = min(timings, key=timings.get)
    return run(_tuned.get(key, default))


def _time_or_inf(run, choice, flush) -> float:
    """µs of run(choice) cold, or infinity where the GPU has not the shared memory its tiles need."""
    try:
        return _cold_time_us(run, choice, flush)
    except triton.runtime.errors.OutOfResources:
        return float("inf")
