"""FP8 (e4m3) weight GEMMs on CUDA: y[M, N] = x[M, K] @ (fp8 W[N, K] * scales)^T (+ bias).

Scales (kernels/fp8_reference.py, the specification): "tensor" [1], "channel" [N], "block"
[ceil(N/bn), ceil(K/bk)]. Two paths, chosen by `fp8_linear_triton` from host ints only (M and
the dtype), so a captured CUDA graph replays the path it recorded:
- w8a16 (M <= W8A16_MAX_M = 64, decode): the skinny GEMM layout of kernels/skinny_gemm.py (grid
  `(cdiv(N, BLOCK_N), SPLIT_K)`, a program streams [BLOCK_N, BLOCK_K] fp8 tiles along K; M == 1
  is a GEMV, 2..64 rows one tl.dot of max(16, next_pow2(M)) rows; split-K partials summed in
  order by skinny_gemm's `_split_reduce_kernel`), the weight converted in registers (fp8 -> x's dtype is exact) and
  scaled in fp32: per channel / tensor once at the end, per block on each K tile (BLOCK_K
  divides bk). Reads the fp8 weight once: half the bytes of bf16. Tuned at warm-up like the
  skinny kernels (skinny_gemm's `_cold_time_us`, candidates W8A16_CONFIGS), never in capture.
- w8a8 (larger M): activations quantized per token (tensor / channel weights) or per token and
  bk group (block weights) by `_quant_kernel`; then `torch._scaled_mm` with rowwise scales
  (bf16, N and K multiples of 16, tensor / channel) or `_w8a8_kernel`: fp8 tl.dot per K tile,
  each tile's product promoted to fp32 and scaled (DeepSeek-V3 style block scaling).
fp32 activations take w8a16 up to W8A16_MAX_M and the dequantize path above (fp32 models are
for tests; fp8 tensor cores would quantize them). Block sizes whose K block has no power-of-two
divisor >= 16 (w8a8: >= 32) also take the dequantize path. No host sync after tuning, shape-only
allocation: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.fp8_reference import (  # noqa: F401 - fp8_path re-exported (the dispatch lives here by contract)
    W8A16_MAX_M,
    Fp8Activation,
    dequantize_fp8_reference,
    fp8_path,
)
from kernels.fp8_w8a8 import (
    STRATEGIES,
    check_fp8_args,
    pow2_divisor,
    w8a8_linear_triton,
)
from kernels.skinny_gemm import SkinnyConfig, _cold_time_us, _split_reduce_kernel

# W8A16_MAX_M (kernels/fp8_reference.py, 64): the w8a16 kernel takes 1..64 rows, one tl.dot tile of
# 16..64 rows (the activation tile [BLOCK_M, BLOCK_K] beside each [BLOCK_N, BLOCK_K] weight tile)
# fp8 tiles are half the bytes of bf16 ones: deeper K tiles for the GEMV, wide N for block scales
W8A16_CONFIGS = (
    SkinnyConfig(16, 1024, 4, 3, 1), SkinnyConfig(8, 1024, 4, 3, 1), SkinnyConfig(32, 512, 4, 3, 1),
    SkinnyConfig(16, 512, 4, 4, 2), SkinnyConfig(32, 256, 4, 3, 1), SkinnyConfig(64, 256, 8, 3, 1),
    SkinnyConfig(32, 128, 4, 4, 1), SkinnyConfig(64, 128, 4, 4, 1), SkinnyConfig(32, 128, 4, 4, 4),
    SkinnyConfig(64, 128, 8, 4, 2), SkinnyConfig(32, 256, 4, 3, 4),
    SkinnyConfig(32, 256, 4, 3, 8), SkinnyConfig(64, 128, 4, 4, 4), SkinnyConfig(64, 256, 8, 3, 2),
)
SPLIT_TARGET = 200  # w8a16_default_config splits K until the grid has ~1.5 programs per H200 SM
_tuned: dict[tuple, SkinnyConfig] = {}


@triton.jit
def _w8a16_kernel(x_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, part_ptr, M, N, stride_x, stride_w, stride_s, stride_y,
                  K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, STRATEGY: tl.constexpr, BN_SCALE: tl.constexpr,
                  BK_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_begin = pid_k * TILES_PER_SPLIT * BLOCK_K
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    s_rows = s_ptr + (offs_n // BN_SCALE) * stride_s  # block scales of these columns
    if BLOCK_M == 1:  # GEMV: fp32 elementwise products, one reduction at the end
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for t in range(TILES_PER_SPLIT):
            k0 = k_begin + t * BLOCK_K
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            prod = w.to(tl.float32) * a[None, :]
            if STRATEGY == 2:
                prod = prod * tl.load(s_rows + k0 // BK_SCALE, mask=n_mask & (k0 < K), other=0.0)[:, None]
            acc2 += prod
        acc = tl.sum(acc2, axis=1)[None, :]
    else:  # 2..64 rows: one BLOCK_M-row tl.dot per K tile, the weight converted exactly to x's dtype
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for t in range(TILES_PER_SPLIT):
            k0 = k_begin + t * BLOCK_K
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :],
                        mask=(rows[:, None] < M) & (offs_k[None, :] < K), other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
            w = tl.trans(w.to(x_ptr.dtype.element_ty))
            if STRATEGY == 2:
                s = tl.load(s_rows + k0 // BK_SCALE, mask=n_mask & (k0 < K), other=0.0)
                acc += tl.dot(a, w, input_precision="ieee") * s[None, :]
            else:
                acc = tl.dot(a, w, acc, input_precision="ieee")
    if STRATEGY == 0:
        acc = acc * tl.load(s_ptr)
    elif STRATEGY == 1:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    out_mask = (rows[:, None] < M) & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(part_ptr + (pid_k * M + rows[:, None]) * N + offs_n[None, :], acc, mask=out_mask)


def _block_m(m: int) -> int:
    return 1 if m == 1 else max(16, triton.next_power_of_2(m))


def w8a16_fits(cfg: SkinnyConfig, m: int, k: int, strategy: str, block) -> bool:
    """Worth timing: skinny_gemm's rules (32..64-row tiles: K tiles <= 256), and BLOCK_K divides
    bk for block scales."""
    dot_ok = m == 1 or (cfg.block_n >= 16 and cfg.block_k <= (512 if m <= 16 else 256))
    block_ok = strategy != "block" or cfg.block_k <= pow2_divisor(block[1], 1 << 30)
    return dot_ok and block_ok and (cfg.split_k == 1 or triton.cdiv(k, cfg.block_k) >= 2 * cfg.split_k)


def w8a16_default_config(m: int, n: int, k: int, strategy: str, block) -> SkinnyConfig:
    """The untuned choice (interpreter, or a key first met in capture). One row: the GEMV's deep K
    tiles. More rows: 32-column tiles up to 16 rows, 64 beyond (more reuse of the activation tile),
    and split-K doubling (up to 8, 4 from 32 rows: the fp32 partials grow with M) until the grid
    reaches SPLIT_TARGET programs, each split keeping >= 2 K tiles (llama-1b at 8-64 rows: qkv, o and
    down split 4, gate_up 1; the former rule left down_proj on 64 programs)."""
    bk = pow2_divisor(block[1], 1024) if strategy == "block" else 1024
    if m == 1:
        cfg = SkinnyConfig(16, min(bk, 1024), 4, 3, 1) if bk >= 512 else SkinnyConfig(64, bk, 4, 4, 1)
        split = 4 if n * k < (16 << 20) and triton.cdiv(k, cfg.block_k) >= 8 else 1
        return cfg._replace(split_k=split)
    cfg = SkinnyConfig(32, min(bk, 256), 4, 3, 1) if m <= 16 else SkinnyConfig(64, min(bk, 128), 4, 4, 1)
    split, k_tiles, n_tiles = 1, triton.cdiv(k, cfg.block_k), triton.cdiv(n, cfg.block_n)
    while n_tiles * split < SPLIT_TARGET and split < (8 if m <= 16 else 4) and k_tiles >= 4 * split:
        split *= 2
    return cfg._replace(split_k=split)


def w8a16_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                        block: tuple[int, int] | None = None, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None, config: SkinnyConfig | None = None) -> torch.Tensor:
    """Weight-only FP8 GEMM for 1..64 rows: x @ dequantize(weight)^T (+ bias) in x's dtype."""
    check_fp8_args(x, weight, scale, strategy, block, bias, out)
    m, (n, k) = x.shape[0], weight.shape
    if not 1 <= m <= W8A16_MAX_M:
        raise ValueError(f"the w8a16 kernel takes 1..{W8A16_MAX_M} rows, got {m}")
    if strategy == "block" and pow2_divisor(block[1], 1 << 30) < 16:
        raise ValueError(f"block {tuple(block)}: bk needs a power-of-two divisor >= 16")
    out = out if out is not None else torch.empty(m, n, device=x.device, dtype=x.dtype)
    bn, bk = block if strategy == "block" else (1, 1)
    stride_s = scale.stride(0) if strategy == "block" else 0

    def run(cfg: SkinnyConfig) -> None:
        part = torch.empty(cfg.split_k, m, n, device=x.device, dtype=torch.float32) if cfg.split_k > 1 else out
        _w8a16_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
            x, weight, scale, bias if bias is not None else scale, out, part,
            m, n, x.stride(0), weight.stride(0), stride_s, out.stride(0),
            K=k, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k),
            STRATEGY=STRATEGIES[strategy], BN_SCALE=bn, BK_SCALE=bk, HAS_BIAS=bias is not None,
            BLOCK_M=_block_m(m), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if cfg.split_k > 1:
            _split_reduce_kernel[(triton.cdiv(n, 1024), m)](
                part, bias if bias is not None else scale, out, m, n, out.stride(0),
                HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, BLOCK=1024, num_warps=4)

    if config is None:
        config = _pick_w8a16(run, x, m, n, k, strategy, block, bias is not None)
    run(config)
    return out


def _pick_w8a16(run, x, m, n, k, strategy, block, has_bias) -> SkinnyConfig:
    """The cached config of this key; times W8A16_CONFIGS on first use on a GPU outside capture."""
    key = (strategy, tuple(block) if block else None, has_bias, triton.next_power_of_2(m), n, k, x.dtype, x.device)
    if key in _tuned:
        return _tuned[key]
    if not x.is_cuda or torch.cuda.is_current_stream_capturing():
        return w8a16_default_config(m, n, k, strategy, block)
    l2_bytes = torch.cuda.get_device_properties(x.device).L2_cache_size
    flush = torch.empty(max(l2_bytes, 32 << 20), dtype=torch.float16, device=x.device)
    candidates = [c for c in W8A16_CONFIGS if w8a16_fits(c, m, k, strategy, block)]
    timings = {cfg: _cold_time_us(run, cfg, flush) for cfg in candidates or [w8a16_default_config(m, n, k, strategy, block)]}
    _tuned[key] = min(timings, key=timings.get)
    return _tuned[key]


def dequantize_linear(x, weight, scale, strategy, block, bias=None) -> torch.Tensor:
    """The dequantize path: dense weight in x's dtype, then one matmul (the pre-kernel forward)."""
    return F.linear(x, dequantize_fp8_reference(weight, scale, strategy, block).to(x.dtype), bias)


def fp8_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, strategy: str,
                      block: tuple[int, int] | None = None, bias: torch.Tensor | None = None,
                      path: str = "auto") -> torch.Tensor:
    """x [..., K] -> [..., N]: the path `fp8_path` picks (or the one forced by `path`). An
    Fp8Activation (quantized by the kernel before: kernels/fp8_fused.py) goes to the w8a8 GEMM."""
    if isinstance(x, Fp8Activation):
        if path not in ("auto", "w8a8"):
            raise ValueError(f"FP8 activations take the w8a8 path, not {path!r}")
        return w8a8_linear_triton(x, weight, scale, strategy, block, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    path = fp8_path(x2.shape[0], x.dtype, strategy, block) if path == "auto" else path
    if path == "w8a16":
        y = w8a16_linear_triton(x2, weight, scale, strategy, block, bias)
    elif path == "w8a8":
        y = w8a8_linear_triton(x2, weight, scale, strategy, block, bias)
    elif path == "dequantize":
        y = dequantize_linear(x2, weight, scale, strategy, block, bias)
    else:
        raise ValueError(f"unknown FP8 GEMM path {path!r}")
    return y.reshape(*lead, weight.shape[0])
