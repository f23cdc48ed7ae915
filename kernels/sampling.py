"""Fused Gumbel-max sampling in Triton: the logits are read once, the noise is made in registers.

Stage 1, `_gumbel_sample_kernel`, grid (N, num_chunks): a program walks one chunk of one row in
BLOCK-wide tiles, computes score = logits / max(T, 1e-5) + g (g = -log(-log(u)), u from the
counter hash of kernels/reference.py, in uint32) or score = logits on greedy rows (T <= 0), and
keeps a per-lane running (max, first index), a token a row's bitmask (structured outputs) does not
allow scoring -inf; it writes its chunk's (max, lowest index of the max)
to a float32/int32 scratch [N, num_chunks]. Stage 2, `_argmax_reduce_kernel`, grid (N,): max over
the chunks, lowest index among the chunks holding it. num_chunks depends on V only, scratch and
output are allocated from shapes: no host sync, CUDA-graph capturable.

Meant to be bit-exact with the reference on the same device: the division is IEEE (div_rn, not
Triton's default approximate `/`), and tl.log on NVIDIA lowers to libdevice `__nv_logf`, the
same logf torch's CUDA log uses. Not verifiable without a GPU here; the tests allow the chosen
token's score to be within 1e-5 (relative) of the best score, for ulp-level log differences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor

BLOCK = 1024  # elements per tile (8 per thread with 4 warps)
TARGET_CHUNK = 4096  # ~elements per program: V = 128256 -> 32 chunks, 32000 -> 8, <= 4096 -> 1
MAX_CHUNKS = 32


@triton.jit
def _mix32(x):
    # x uint32: the multiplications wrap mod 2**32, as `& 0xFFFFFFFF` does in the int64 reference.
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x2C1B3C6D
    return x ^ (x >> 16)


@triton.jit
def _key(seed, position):
    """A row's noise key from its int64 seed and position (kernels/reference.py's, in uint32)."""
    seed_lo = seed.to(tl.uint32)  # int64 -> uint32 truncates: the low 32 bits
    seed_hi = (seed >> 32).to(tl.uint32)
    return _mix32(_mix32(_mix32(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ position.to(tl.uint32))


@triton.jit
def gumbel_noise(key, j):
    """-log(-log(u)) for token ids j (uint32) of a row's key: u in (0, 1) from the counter hash
    (kernels/reference.py's uniform_noise), the sampler's Gumbel noise; key and j broadcast."""
    bits = _mix32(_mix32(key ^ j) + j)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return -tl.log(-tl.log(u))


@triton.jit
def _chunk_argmax(row_ptr, mask_row_ptr, start, end, vocab, key, temperature, ADD_NOISE: tl.constexpr,
                  HAS_MASK: tl.constexpr, BLOCK: tl.constexpr):
    """(max score, lowest index of it) over [start, min(end, vocab)); index `vocab` if empty.
    HAS_MASK: token j scores -inf unless bit j % 32 of word j // 32 of the row's mask is set."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], vocab, tl.int32)
    for tile in range(start, end, BLOCK):
        offs = tile + lanes
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if ADD_NOISE:
            x = tl.math.div_rn(x, temperature) + gumbel_noise(key, offs.to(tl.uint32))
        if HAS_MASK:
            word = tl.load(mask_row_ptr + (offs >> 5), mask=valid, other=0)
            x = tl.where(((word >> (offs & 31)) & 1) != 0, x, float("-inf"))
        # Strictly greater keeps a lane's earliest index on ties; the first valid entry of a lane
        # is always taken, so an all -inf row still yields its first index (as torch.argmax).
        take = valid & ((x > best) | (best_idx == vocab))
        best = tl.where(take, x, best)
        best_idx = tl.where(take, offs, best_idx)
    chunk_max = tl.max(best, 0)
    chunk_idx = tl.min(tl.where((best == chunk_max) & (best_idx < vocab), best_idx, vocab), 0)
    return chunk_max, chunk_idx


@triton.jit
def _gumbel_sample_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, positions_ptr, mask_ptr, max_ptr, idx_ptr,
    stride_l, stride_m, vocab, chunk_size, num_chunks,
    HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_l
    mask_row_ptr = mask_ptr + row.to(tl.int64) * stride_m
    start = chunk * chunk_size
    end = start + chunk_size
    temperature = tl.load(temperature_ptr + row)
    if temperature > 0:
        key = _key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row))
        chunk_max, chunk_idx = _chunk_argmax(row_ptr, mask_row_ptr, start, end, vocab, key,
                                             tl.maximum(temperature, 1e-5), True, HAS_MASK, BLOCK)
    else:
        chunk_max, chunk_idx = _chunk_argmax(row_ptr, mask_row_ptr, start, end, vocab, 0, 1.0, False,
                                             HAS_MASK, BLOCK)
    tl.store(max_ptr + row * num_chunks + chunk, chunk_max)
    tl.store(idx_ptr + row * num_chunks + chunk, chunk_idx)


@triton.jit
def _argmax_reduce_kernel(max_ptr, idx_ptr, out_ptr, vocab, num_chunks, CHUNKS_P2: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, CHUNKS_P2)
    valid = offs < num_chunks
    m = tl.load(max_ptr + row * num_chunks + offs, mask=valid, other=float("-inf"))
    idx = tl.load(idx_ptr + row * num_chunks + offs, mask=valid, other=vocab)
    best = tl.max(m, 0)
    # Chunks hold increasing index ranges and each reports its lowest index of its max, so the
    # lowest index among the chunks reaching the row max is the row's first argmax.
    token = tl.min(tl.where((m == best) & (idx < vocab), idx, vocab), 0)
    tl.store(out_ptr + row, token.to(tl.int64))


def gumbel_chunks(vocab: int) -> tuple[int, int]:
    """(num_chunks, chunk_size) from V only; chunk_size is a multiple of BLOCK."""
    num_chunks = max(1, min(MAX_CHUNKS, triton.cdiv(vocab, TARGET_CHUNK)))
    chunk_size = triton.cdiv(triton.cdiv(vocab, num_chunks), BLOCK) * BLOCK
    return triton.cdiv(vocab, chunk_size), chunk_size


def gumbel_sample_triton(
    logits: torch.Tensor,  # [N, V] float32 | bfloat16, last dim contiguous
    temperature: torch.Tensor,  # [N] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [N] int64
    positions: torch.Tensor,  # [N] int64
    allowed: torch.Tensor | None = None,  # [N, ceil(V / 32)] int32 token bitmask, or None
) -> torch.Tensor:
    """[N] int64 sampled ids; same contract as kernels.reference.gumbel_sample_reference."""
    check_tensor("logits", logits, 2, (torch.float32, torch.bfloat16))
    check_tensor("temperature", temperature, 1, (torch.float32,))
    check_tensor("seeds", seeds, 1, (torch.int64,))
    check_tensor("positions", positions, 1, (torch.int64,))
    check_same_device(logits=logits, temperature=temperature, seeds=seeds, positions=positions)
    num_rows, vocab = logits.shape
    for name, t in (("temperature", temperature), ("seeds", seeds), ("positions", positions)):
        if t.shape[0] != num_rows:
            raise ValueError(f"{name} has {t.shape[0]} entries, logits has {num_rows} rows")
    if vocab == 0 or vocab >= 2**31 - 1:
        raise ValueError(f"vocab size must be in [1, 2**31 - 1), got {vocab}")
    if allowed is not None:
        check_tensor("allowed", allowed, 2, (torch.int32,))
        check_same_device(logits=logits, allowed=allowed)
        if allowed.shape[0] != num_rows or allowed.shape[1] * 32 < vocab or allowed.stride(1) != 1:
            raise ValueError(f"allowed must be [{num_rows}, >= {triton.cdiv(vocab, 32)}] with contiguous "
                             f"rows, got {tuple(allowed.shape)}")
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    temperature, seeds, positions = temperature.contiguous(), seeds.contiguous(), positions.contiguous()
    num_chunks, chunk_size = gumbel_chunks(vocab)
    chunk_max = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
    chunk_idx = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
    _gumbel_sample_kernel[(num_rows, num_chunks)](
        logits, temperature, seeds, positions, allowed if allowed is not None else logits,
        chunk_max, chunk_idx, logits.stride(0), allowed.stride(0) if allowed is not None else 0,
        vocab, chunk_size, num_chunks, HAS_MASK=allowed is not None, BLOCK=BLOCK, num_warps=4,
    )
    _argmax_reduce_kernel[(num_rows,)](
        chunk_max, chunk_idx, out, vocab, num_chunks,
        CHUNKS_P2=max(16, triton.next_power_of_2(num_chunks)), num_warps=1,
    )
    return out
