"""Random paged-attention cases shared by the kernel tests, and a dense attention written apart
from kernels/reference.py (per-position slot lookup + torch SDPA with an explicit mask)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import pytest
import torch


@dataclass
class PagedCase:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]; NaN outside valid slots
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, shuffled ids >= 1, unused columns 0
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    scale: float
    max_query_len: int
    max_seq_len: int


def make_case(
    q_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
    block_size: int, dtype: torch.dtype, device: str | torch.device, seed: int = 0,
    extra_blocks: int = 3, extra_columns: int = 2, sliding_window: int = 0,
) -> PagedCase:
    """Caches hold random K/V in each request's slots and NaN everywhere else (block 0 included),
    so reading anything outside a request's valid context shows up as NaN. With a sliding
    window, the blocks wholly before the window of a request's first new token are NaN too."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + extra_blocks
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    max_blocks = max(blocks_per_seq + [1]) + extra_columns
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    k_flat, v_flat = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    for i, (n, s) in enumerate(zip(blocks_per_seq, seq_lens)):
        block_tables[i, :n] = torch.tensor(ids[:n], dtype=torch.int32)
        ids = ids[n:]
        slots = slots_of(block_tables[i], s, block_size)
        k_flat[slots] = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        v_flat[slots] = torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype)
        if sliding_window:
            first_visible = max(s - q_lens[i] - sliding_window + 1, 0)
            for block in block_tables[i, :first_visible // block_size].tolist():
                k_cache[block] = v_cache[block] = float("nan")
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    q = torch.randn(qsl[-1], num_heads, head_dim, generator=gen).to(dtype)
    return PagedCase(
        q.to(device), k_cache.to(device), v_cache.to(device), block_tables.to(device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        torch.tensor(qsl, dtype=torch.int32, device=device),
        head_dim ** -0.5, max(q_lens + [0]), max(seq_lens + [0]),
    )


def slots_of(block_table: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """Slot of each position 0..seq_len-1, one position at a time (as the contract states it)."""
    bt = block_table.tolist()
    return torch.tensor([bt[p // block_size] * block_size + p % block_size for p in range(seq_len)],
                        dtype=torch.long)


def dense_attention(case: PagedCase, sliding_window: int = 0) -> torch.Tensor:
    """Expected output in float32: SDPA over each request's gathered K/V with an explicit mask;
    with a window, query q sees keys q - window < k <= q (and only those are gathered)."""
    num_heads = case.q.shape[1]
    _, block_size, num_kv_heads, head_dim = case.k_cache.shape
    group = num_heads // num_kv_heads
    k_flat = case.k_cache.float().cpu().reshape(-1, num_kv_heads, head_dim)
    v_flat = case.v_cache.float().cpu().reshape(-1, num_kv_heads, head_dim)
    q = case.q.float().cpu()
    out = torch.zeros_like(q)
    qsl = case.query_start_loc.tolist()
    for i, seq_len in enumerate(case.seq_lens.tolist()):
        start, end = qsl[i], qsl[i + 1]
        if end == start or seq_len == 0:
            continue
        q_pos = torch.arange(seq_len - (end - start), seq_len)
        k_pos = torch.arange(seq_len)
        if sliding_window:
            k_pos = k_pos[k_pos > q_pos[0] - sliding_window]
        slots = slots_of(case.block_tables[i].cpu(), seq_len, block_size)[k_pos]
        k = k_flat[slots].transpose(0, 1).repeat_interleave(group, dim=0)  # [H, L, D]
        v = v_flat[slots].transpose(0, 1).repeat_interleave(group, dim=0)
        qi = q[start:end].transpose(0, 1)  # [H, q_len, D]
        mask = k_pos[None, :] <= q_pos[:, None]  # [q_len, L], True = attend
        if sliding_window:
            mask &= k_pos[None, :] > q_pos[:, None] - sliding_window
        o = torch.nn.functional.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=case.scale)
        out[start:end] = o.transpose(0, 1)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float().cpu(), ref.float().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def gumbel_case(n: int, vocab: int, seed: int = 0):
    """Random logits with T = 0 rows, T in (0.3, 1.5) rows, rows that are mostly -inf, one all -inf
    row, tied maxima and 63-bit seeds: (logits float32, temperature, seeds, positions)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * 4
    temperature = torch.rand(n, generator=gen) * 1.2 + 0.3
    temperature[torch.rand(n, generator=gen) < 0.3] = 0.0
    for r in range(0, n, 3):  # top-k/top-p style cut: only a handful survive
        keep = torch.randperm(vocab, generator=gen)[: 1 + r % 7]
        cut = torch.ones(vocab, dtype=torch.bool)
        cut[keep] = False
        logits[r].masked_fill_(cut, float("-inf"))
    if n > 4:
        logits[4] = float("-inf")  # nothing left: argmax of all -inf is index 0
    if n > 1:
        logits[1, vocab // 2] = logits[1, vocab // 3] = logits[1].max() + 1  # tie: lowest index
    seeds = torch.randint(0, 1 << 62, (n,), generator=gen)
    seeds[0] = (1 << 63) - 1
    positions = torch.randint(0, 1 << 20, (n,), generator=gen)
    return logits, temperature, seeds, positions


ON_CUDA = torch.cuda.is_available()
# the Triton tests' dtypes: the serving half types on CUDA; the interpreter (numpy) has no bf16
DTYPES = [torch.bfloat16, torch.float16] if ON_CUDA else [torch.float16, torch.float32]
POISON = float("nan")  # output buffers start as NaN: a row the kernel forgets shows
# Triton tests run on CUDA; on CPU only under TRITON_INTERPRET=1 (the Triton interpreter).
INTERPRET = not ON_CUDA and os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton")
DEVICE = "cuda" if ON_CUDA else "cpu"
TRITON_MARKS = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (ON_CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1 with triton)"),
]


def tier(values: list, fast) -> list:
    """Parametrize values, on CUDA those not in `fast` marked cuda_slow: the fast tier (pytest -m
    "cuda and not cuda_slow") runs the product of every parametrize's fast values, the cuda_slow
    tier the rest. Interpreted (CPU) runs are not split: their shapes are small already."""
    if not ON_CUDA:
        return list(values)
    return [v if v in fast else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.cuda_slow)
            for v in values]


def tolerance(dtype: torch.dtype) -> float:
    """Relative error a Triton kernel may show against its fp32 reference in this dtype."""
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


FP8 = torch.float8_e4m3fn


def fp8_case(case: PagedCase, k_scale: float, v_scale: float) -> tuple[PagedCase, PagedCase, tuple]:
    """(the case with FP8 caches holding its K/V quantized with these scales (NaN stays NaN), the
    same case over the dequantized float32 caches (what the FP8 kernels must compute), (k_scale,
    v_scale) as float32 [1] tensors on the case's device)."""
    from dataclasses import replace

    from kernels.reference import dequantize_kv_reference, quantize_kv_reference

    device = case.q.device
    ks, vs = (torch.tensor([s], dtype=torch.float32, device=device) for s in (k_scale, v_scale))
    k8 = quantize_kv_reference(case.k_cache, FP8, ks)
    v8 = quantize_kv_reference(case.v_cache, FP8, vs)
    quantized = replace(case, k_cache=k8, v_cache=v8)
    dense = replace(case, k_cache=dequantize_kv_reference(k8, ks), v_cache=dequantize_kv_reference(v8, vs))
    return quantized, dense, (ks, vs)


def mixed_lens(rng, kinds: list[str], max_ctx: int) -> tuple[list[int], list[int]]:
    """(q_lens, seq_lens) of a mixed varlen batch: per kind a prefill (<= 700 new tokens), a
    chunk over a cached prefix (<= 300), a decode row or a padded row (seq_len 0)."""
    q_lens, seq_lens = [], []
    for kind in kinds:
        seq_len = rng.randint(1, max_ctx)
        q_len = {"prefill": min(seq_len, 700), "chunk": rng.randint(1, min(seq_len, 300)), "decode": 1,
                 "padded": 1}[kind]
        q_lens.append(q_len)
        seq_lens.append(0 if kind == "padded" else max(seq_len, q_len))
    return q_lens, seq_lens


def bitmask_case(n: int, vocab: int, seed: int = 0):
    """(allowed [n, ceil(V / 32)] int32 token bitmask, the same as bool [n, V]): rows that allow
    about half the vocabulary, a handful of tokens, exactly one, none, and every token (-1 words,
    the sign bit too)."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(n, vocab, generator=gen) < 0.5
    for r in range(1, n, 4):
        dense[r] = False
        dense[r, torch.randperm(vocab, generator=gen)[: 1 + r % 5]] = True
    if n > 2:
        dense[2] = False
        dense[2, vocab - 1] = True  # the last token only (the last word's high bits)
    if n > 3:
        dense[3] = True
    words = (vocab + 31) // 32
    padded = torch.zeros(n, words * 32, dtype=torch.int64)
    padded[:, :vocab] = dense.long()
    bits = (padded.view(n, words, 32) << torch.arange(32)).sum(-1)  # uint32 values in int64
    allowed = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)
    return allowed, dense
