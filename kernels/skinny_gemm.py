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
accumulation (`_skinny_acc`, kernels/skinny_acc.py) is shared with the fused qkv + rope kernel
(kernels/skinny_rope.py). W is 16-bit in x's dtype or an FP8 `Fp8Weight` (kernels/fp8_weight.py:
e4m3 tiles, a per-tensor or per-column scale applied in the epilogue).

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
from kernels.fp8_weight import Fp8Weight, unpack_weight
from kernels.skinny_acc import _skinny_acc, _w_scaled
from kernels.skinny_tune import (  # noqa: F401
    CONFIGS, MAX_M, SkinnyConfig, _cold_time_us, default_config, fits, launch_constants, pick_config,
)

PROLOGUE_NONE, PROLOGUE_RMS, PROLOGUE_SILU = 0, 1, 2


@triton.jit
def _skinny_kernel(
    x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, bias_ptr, y_ptr, part_ptr,
    M, N, stride_x, stride_r, stride_nr, stride_w, stride_y, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    NORM_BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False, DOT: tl.constexpr = True,
    ws_ptr=None, W_SCALE: tl.constexpr = 0,
):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_begin = pid_k * TILES_PER_SPLIT * BLOCK_K  # this split's run of K tiles (masked past K)
    acc = _skinny_acc(x_ptr, r_ptr, nw_ptr, nr_ptr, w_ptr, offs_n, n_mask, k_begin, (pid_n == 0) & (pid_k == 0),
                      M, stride_x, stride_r, stride_nr, stride_w, eps, K, TILES_PER_SPLIT, PROLOGUE,
                      HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, USE_PDL, DOT)
    acc = _w_scaled(acc, ws_ptr, offs_n, n_mask, W_SCALE)  # an FP8 weight's scale (each split's: linear)
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
    w, w_scale, w_scale_kind = unpack_weight(w)
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
        ws_ptr=w_scale, W_SCALE=w_scale_kind, **launch_constants(cfg, m, k), **launch,
    )
    if cfg.split_k > 1:
        _split_reduce_kernel[(triton.cdiv(n, 1024), m)](
            part, bias if bias is not None else w, out, m, n, out.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, BLOCK=1024, USE_PDL=pdl, num_warps=4, **launch,
        )


def _skinny(prologue: int, x: torch.Tensor, w: torch.Tensor | Fp8Weight, bias: torch.Tensor | None,
            out: torch.Tensor | None, residual: torch.Tensor | None = None,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0,
            config: SkinnyConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks arguments, picks a config, launches; returns (y, new_residual or x)."""
    tensors = check_skinny_args(x, w, bias, residual, norm_weight, MAX_M, gated=prologue == PROLOGUE_SILU)
    w_read, _, w_scale_kind = unpack_weight(w)
    m, (n, k) = x.shape[0], w_read.shape
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
        key = (prologue, bias is not None, triton.next_power_of_2(m), n, k, x.dtype, w_read.dtype, w_scale_kind,
               x.device)  # pdl or not: one config
        config = pick_config(key, run, x.is_cuda, m, n, k)
    run(config)
    return out, new_residual


def skinny_linear_triton(x: torch.Tensor, w: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None,
                         out: torch.Tensor | None = None, config: SkinnyConfig | None = None,
                         pdl: bool = False) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias [N]) -> [M, N] in x's dtype (written to `out` if given); w a
    16-bit tensor in x's dtype or an Fp8Weight (each of these functions). pdl: launched as a programmatic dependent launch (Hopper; see the module's docstring)."""
    return _skinny(PROLOGUE_NONE, x, w, bias, out, config=config, pdl=pdl)[0]


def rms_norm_linear_triton(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                           eps: float, w: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None,
                           config: SkinnyConfig | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x [+ residual]) * norm_weight) @ w^T (+ bias) -> (y [M, N], new residual [M, K])."""
    return _skinny(PROLOGUE_RMS, x, w, bias, None, residual, norm_weight, eps, config, pdl)


def silu_mul_linear_triton(gate_up: torch.Tensor, w: torch.Tensor | Fp8Weight,
                           config: SkinnyConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """(silu(gate_up[:, :I]) * gate_up[:, I:]) @ w [N, I]^T -> [M, N] in gate_up's dtype."""
    return _skinny(PROLOGUE_SILU, gate_up, w, None, None, config=config, pdl=pdl)[0]
