"""Speculative decoding's rejection rule for rows without top-k / top-p, fused in Triton: each
draft position's logits are read once; the rule is kernels/reference_reject.py's.

Stage 1, `_reject_chunk_kernel`, grid (M, num_chunks): a program walks one chunk of one row in
NUM_TILES tiles of BLOCK. Greedy rows (T <= 0) keep a per-lane running (max, first index) of the
logits. Random rows scale s = l / max(T, 1e-5) (IEEE division), keep a per-lane online
log-sum-exp of s (running max and sum of exp) and a per-lane running (max, first index) of
s + g over every token but the draft (g: the sampler's Gumbel noise, kernels/sampling.py);
each chunk writes (best score, its lowest index, max of s, sum of exp(s - max)). Stage 2,
`_reject_reduce_kernel`, grid (M,): the row's best over the chunks (lowest index on ties), its
log-sum-exp, p(draft) = exp(s_d - lse) and the acceptance uniform u (the counter hash of
(seed ^ accept_key, position, 0)): accepted = u < p(draft), or draft == argmax on greedy rows.

The sampler's general path (spec_decode/verify.py) spends ~70 small kernel launches on the same
rule (the reference's hash alone is ~50): this is two. The chunk count depends on V only, the
loop bounds are constexpr (TRITON_INTERPRET runs it on CPU); no host sync, graph-capturable.
tl.exp is an approximate exponential: p(draft) may differ from the reference's in the last
bits, so a draw with u within ~1e-6 of p(draft) may go the other way (tests allow it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor
from kernels.sampling import BLOCK, _key, _mix32, gumbel_chunks


@triton.jit
def _reject_chunk_kernel(
    logits_ptr, draft_ptr, temperature_ptr, seeds_ptr, positions_ptr,
    best_ptr, idx_ptr, lmax_ptr, lsum_ptr, stride_l, vocab, num_chunks,
    NUM_TILES: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_l
    start = chunk * (NUM_TILES * BLOCK)
    lanes = tl.arange(0, BLOCK)
    temperature = tl.load(temperature_ptr + row)
    random_row = temperature > 0
    draft = tl.load(draft_ptr + row)
    key = _key(tl.load(seeds_ptr + row), tl.load(positions_ptr + row))
    t = tl.maximum(temperature, 1e-5)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], vocab, tl.int32)
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    for i in range(NUM_TILES):
        offs = start + i * BLOCK + lanes
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if random_row:
            s = tl.math.div_rn(x, t)
            new_max = tl.maximum(lane_max, s)
            live = new_max > float("-inf")
            lane_sum = tl.where(live, lane_sum * tl.exp(lane_max - new_max) + tl.exp(s - new_max), 0.0)
            lane_max = new_max
            j = offs.to(tl.uint32)
            u = ((_mix32(_mix32(key ^ j) + j) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            x = tl.where(offs == draft, float("-inf"), s - tl.log(-tl.log(u)))
        # Strictly greater keeps a lane's earliest index on ties (as torch.argmax).
        take = valid & ((x > best) | (best_idx == vocab))
        best = tl.where(take, x, best)
        best_idx = tl.where(take, offs, best_idx)
    chunk_best = tl.max(best, 0)
    chunk_idx = tl.min(tl.where((best == chunk_best) & (best_idx < vocab), best_idx, vocab), 0)
    chunk_max = tl.max(lane_max, 0)
    chunk_sum = tl.sum(tl.where(lane_max > float("-inf"), lane_sum * tl.exp(lane_max - chunk_max), 0.0), 0)
    out = row * num_chunks + chunk
    tl.store(best_ptr + out, chunk_best)
    tl.store(idx_ptr + out, chunk_idx)
    tl.store(lmax_ptr + out, chunk_max)
    tl.store(lsum_ptr + out, chunk_sum)


@triton.jit
def _reject_reduce_kernel(
    logits_ptr, draft_ptr, temperature_ptr, seeds_ptr, positions_ptr,
    best_ptr, idx_ptr, lmax_ptr, lsum_ptr, accepted_ptr, recovered_ptr,
    stride_l, vocab, num_chunks, accept_key, CHUNKS_P2: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, CHUNKS_P2)
    valid = offs < num_chunks
    base = row * num_chunks
    best = tl.load(best_ptr + base + offs, mask=valid, other=float("-inf"))
    idx = tl.load(idx_ptr + base + offs, mask=valid, other=vocab)
    top = tl.max(best, 0)
    token = tl.min(tl.where((best == top) & (idx < vocab), idx, vocab), 0)
    draft = tl.load(draft_ptr + row)
    temperature = tl.load(temperature_ptr + row)
    accepted = token == draft
    if temperature > 0:
        m = tl.load(lmax_ptr + base + offs, mask=valid, other=float("-inf"))
        s = tl.load(lsum_ptr + base + offs, mask=valid, other=0.0)
        row_max = tl.max(m, 0)
        lse = row_max + tl.log(tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - row_max), 0.0), 0))
        has_draft = draft >= 0  # (-1: none; never accepted, its token the plain draw)
        x = tl.load(logits_ptr + row.to(tl.int64) * stride_l + draft, mask=has_draft, other=0.0).to(tl.float32)
        p_draft = tl.exp(tl.math.div_rn(x, tl.maximum(temperature, 1e-5)) - lse)
        key = _key(tl.load(seeds_ptr + row) ^ accept_key, tl.load(positions_ptr + row))
        u = ((_mix32(_mix32(key)) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # token index 0
        accepted = (u < p_draft) & has_draft
    tl.store(accepted_ptr + row, accepted)
    tl.store(recovered_ptr + row, token.to(tl.int64))


def rejection_sample_triton(
    logits: torch.Tensor,  # [M, V] float32 | bfloat16, last dim contiguous
    draft_ids: torch.Tensor,  # [M] int64, in [0, V), or -1: no draft (the plain draw)
    temperature: torch.Tensor,  # [M] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [M] int64
    positions: torch.Tensor,  # [M] int64
    accept_key: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted [M] bool, recovered [M] int64); the contract of
    kernels.reference_reject.rejection_sample_reference."""
    check_tensor("logits", logits, 2, (torch.float32, torch.bfloat16))
    for name, t, dtype in (("draft_ids", draft_ids, torch.int64), ("temperature", temperature, torch.float32),
                           ("seeds", seeds, torch.int64), ("positions", positions, torch.int64)):
        check_tensor(name, t, 1, (dtype,))
        if t.shape[0] != logits.shape[0]:
            raise ValueError(f"{name} has {t.shape[0]} entries, logits has {logits.shape[0]} rows")
    check_same_device(logits=logits, draft_ids=draft_ids, temperature=temperature, seeds=seeds, positions=positions)
    num_rows, vocab = logits.shape
    if vocab == 0 or vocab >= 2**31 - 1:
        raise ValueError(f"vocab size must be in [1, 2**31 - 1), got {vocab}")
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    accepted = torch.empty(num_rows, dtype=torch.bool, device=logits.device)
    recovered = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return accepted, recovered
    draft_ids, temperature, seeds, positions = (t.contiguous() for t in (draft_ids, temperature, seeds, positions))
    num_chunks, chunk_size = gumbel_chunks(vocab)
    scratch = [torch.empty(num_rows, num_chunks, dtype=dt, device=logits.device)
               for dt in (torch.float32, torch.int32, torch.float32, torch.float32)]
    _reject_chunk_kernel[(num_rows, num_chunks)](
        logits, draft_ids, temperature, seeds, positions, *scratch, logits.stride(0), vocab, num_chunks,
        NUM_TILES=chunk_size // BLOCK, BLOCK=BLOCK, num_warps=4)
    _reject_reduce_kernel[(num_rows,)](
        logits, draft_ids, temperature, seeds, positions, *scratch, accepted, recovered,
        logits.stride(0), vocab, num_chunks, accept_key,
        CHUNKS_P2=max(16, triton.next_power_of_2(num_chunks)), num_warps=1)
    return accepted, recovered
