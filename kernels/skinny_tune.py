"""The skinny GEMMs' launch configurations (kernels/skinny_gemm.py): the candidates, the untuned
default, and the first-call tuning of a key, timed in CUDA graphs with a cold L2 (kernel + split
reduce) and cached in the process."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

MAX_M = 16  # the most rows of a skinny GEMM: one 16-row tl.dot tile


class SkinnyConfig(NamedTuple):
    """One launch configuration of the skinny kernels (hashable: the key of a timing)."""
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int
    dot: bool = True  # 2+ rows: one tl.dot of 16 padded rows; False: CUDA-core products (M = 1 always is)


# Timed on the H200 (bf16, llama-1b / SmolLM2 shapes, cold L2, in graphs): M == 1 (GEMV) wants
# narrow, deep tiles (8..16 x 512..1024); M > 1 (tl.dot) wider ones, split-K for small N.
CONFIGS = (
    SkinnyConfig(8, 512, 4, 3, 1), SkinnyConfig(8, 1024, 4, 3, 1), SkinnyConfig(16, 512, 4, 3, 1),
    SkinnyConfig(16, 1024, 8, 2, 1), SkinnyConfig(16, 256, 4, 3, 1), SkinnyConfig(32, 256, 4, 3, 1),
    SkinnyConfig(64, 256, 8, 3, 1), SkinnyConfig(128, 128, 8, 3, 1), SkinnyConfig(64, 128, 4, 4, 1),
    SkinnyConfig(16, 256, 4, 3, 4), SkinnyConfig(32, 128, 4, 4, 4), SkinnyConfig(32, 256, 4, 3, 4),
    # 2..16 rows on CUDA cores (the GEMV's loop with a row axis): untimed yet
    SkinnyConfig(4, 256, 2, 3, 1, False), SkinnyConfig(8, 256, 4, 3, 1, False), SkinnyConfig(4, 512, 4, 3, 1, False),
    SkinnyConfig(8, 512, 8, 3, 1, False), SkinnyConfig(16, 256, 8, 3, 1, False), SkinnyConfig(8, 256, 4, 3, 4, False),
    SkinnyConfig(4, 128, 4, 3, 1, False),
)
GEMV_REGS = 128  # fp32 partial sums a thread may hold in a CUDA-core config of 2+ rows
_tuned: dict[tuple, SkinnyConfig] = {}


def default_config(m: int, n: int, k: int) -> SkinnyConfig:
    """The untuned choice (interpreter, or a key first met in capture), good on the H200."""
    if m == 1:
        return SkinnyConfig(16, 512, 4, 3, 1)
    return SkinnyConfig(32, 256, 4, 3, 4 if n * k < (16 << 20) and triton.cdiv(k, 256) >= 8 else 1)


def fits(cfg: SkinnyConfig, m: int, k: int) -> bool:
    """Worth timing: tl.dot (m > 1) wants 16+ columns, depth <= 512 (spills); CUDA-core products
    of 2+ rows at most GEMV_REGS partial sums a thread (one row: the dot flag means nothing, so
    only dot=True configs); 2+ tiles a split."""
    if m == 1:
        shape_ok = cfg.dot
    elif cfg.dot:
        shape_ok = cfg.block_n >= 16 and cfg.block_k <= 512
    else:
        shape_ok = triton.next_power_of_2(m) * cfg.block_n * cfg.block_k <= GEMV_REGS * 32 * cfg.num_warps
    return shape_ok and (cfg.split_k == 1 or triton.cdiv(k, cfg.block_k) >= 2 * cfg.split_k)


def rope_fits(cfg: SkinnyConfig, head_dim: int) -> bool:
    """Usable by the fused rope kernel (kernels/skinny_rope.py): no split (the epilogue needs the
    whole sum), and a program's BLOCK_N // 2 rotary pairs dividing one head's D / 2 (powers of two)."""
    return cfg.split_k == 1 and 2 <= cfg.block_n <= head_dim and cfg.block_n & (cfg.block_n - 1) == 0


def rope_default_config(m: int, n: int, k: int, head_dim: int) -> SkinnyConfig:
    """default_config made valid for the fused rope kernel (no split, at most one head wide)."""
    cfg = default_config(m, n, k)
    return cfg._replace(split_k=1, block_n=min(cfg.block_n, head_dim))


def _cold_time_us(run, cfg: SkinnyConfig, flush: torch.Tensor, reps: int = 8) -> float:
    """µs of run(cfg), L2 cold as in a decode step: graph of reps x (read flush, run) - reads."""
    def replay_us(with_run: bool) -> float:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                flush.amax()
                if with_run:
                    run(cfg)
        graph.replay()  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / reps

    run(cfg)  # compile outside the capture
    return replay_us(True) - replay_us(False)


def pick_config(key: tuple, run, on_cuda: bool, m: int, n: int, k: int, keep=None,
                default: SkinnyConfig | None = None) -> SkinnyConfig:
    """The cached config of key; tunes on first use on a GPU outside graph capture. keep: a
    further filter of the candidates (a kernel's own limits), default: the untuned choice then."""
    if key in _tuned:
        return _tuned[key]
    if not on_cuda or torch.cuda.is_current_stream_capturing():
        return default or default_config(m, n, k)
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    flush = torch.empty(max(l2_bytes, 32 << 20), dtype=torch.float16, device="cuda")  # 2x the L2
    timings = {cfg: _cold_time_us(run, cfg, flush) for cfg in CONFIGS
               if fits(cfg, m, k) and (keep is None or keep(cfg))}
    _tuned[key] = min(timings, key=timings.get)
    return _tuned[key]


def launch_constants(cfg: SkinnyConfig, m: int, k: int) -> dict:
    """The compile-time shape arguments of `_skinny_acc` for cfg at m rows and depth k."""
    block_m = MAX_M if m > 1 and cfg.dot else triton.next_power_of_2(m)
    return dict(K=k, TILES_PER_SPLIT=triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k), BLOCK_M=block_m,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                NORM_BLOCK=max(cfg.block_k, min(triton.next_power_of_2(k), 8192 // block_m)),
                DOT=cfg.dot)
