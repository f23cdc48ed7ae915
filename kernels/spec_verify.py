"""The verify scan in one Triton launch (reference: kernels/reference_verify.py), grid (S,): a
program per verify row loads its drafts' accept flags as one vector, finds the first rejection,
picks the final token, writes the row's tokens, its chain flag and its last token. It replaced
about 17 small torch ops a verify step (host launches on the step's critical path). Up to 15
drafts a row, two variants (with chained rows or not: the start-up warm-up runs both); the
tokens' width is a runtime argument.
Sizes come from shapes and the host's max_drafts only: no host sync."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device

MIN_BLOCK_D = 16  # lanes of a program: one variant up to 15 drafts a row (each power of two past it: one more)


@triton.jit(do_not_specialize=["cols"])
def _verify_scan_kernel(acc_ptr, rec_ptr, draft_ptr, start_ptr, nd_ptr, rows_ptr, last_ptr, ok_ptr, chained_ptr,
                        prev_ptr, tokens_ptr, n_ptr, final_ptr, valid_ptr, cols,
                        HAS_CHAIN: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    start = tl.load(start_ptr + i)
    d = tl.load(nd_ptr + i).to(tl.int32)
    row = tl.load(rows_ptr + i)
    j = tl.arange(0, BLOCK_D)  # BLOCK_D > max_drafts: one vector holds the row's drafts and final token
    inside = j < d
    acc = tl.load(acc_ptr + start + j, mask=inside, other=1)
    n = tl.min(tl.where(inside & (acc == 0), j, d), axis=0)  # the first rejection, else d
    bonus = tl.load(last_ptr + row)
    rejected_at = tl.load(rec_ptr + start + n, mask=n < d, other=0)
    final = tl.where(n < d, rejected_at, bonus)
    drafts = tl.load(draft_ptr + start + j, mask=j < n, other=0)  # the accepted drafts, the final token, zeros
    tl.store(tokens_ptr + i * cols + j, tl.where(j == n, final, drafts), mask=j < cols)
    full = n == d
    if HAS_CHAIN:
        valid = (tl.load(chained_ptr + i) == 0) | (tl.load(ok_ptr + row) != 0)
        full = full & valid
        final = tl.where(valid, final, tl.load(prev_ptr + i))
        tl.store(valid_ptr + i, valid.to(tl.uint8))
    tl.store(ok_ptr + row, full.to(tl.uint8))
    tl.store(last_ptr + row, final)
    tl.store(n_ptr + i, n.to(tl.int64))
    tl.store(final_ptr + i, final)


def verify_scan_triton(accepted, recovered, draft_ids, draft_start, num_drafts, rows, last_tokens, chain_ok,
                       chained, prev_last, max_drafts: int):
    """kernels.verify_scan on CUDA tensors (the reference's contract)."""
    check_same_device(accepted=accepted, recovered=recovered, draft_ids=draft_ids, draft_start=draft_start,
                      num_drafts=num_drafts, rows=rows, last_tokens=last_tokens, chain_ok=chain_ok)
    s = rows.numel()
    tokens = torch.empty(s, max_drafts + 1, dtype=torch.int64, device=rows.device)
    n = torch.empty(s, dtype=torch.int64, device=rows.device)
    final = torch.empty(s, dtype=torch.int64, device=rows.device)
    has_chain = chained is not None
    valid = torch.empty(s, dtype=torch.bool, device=rows.device) if has_chain else None
    if s:
        u8 = lambda t: t.view(torch.uint8)  # noqa: E731 - bool tensors as bytes
        _verify_scan_kernel[(s,)](
            u8(accepted.contiguous()), recovered, draft_ids, draft_start, num_drafts, rows, last_tokens,
            u8(chain_ok), u8(chained) if has_chain else chain_ok, prev_last if has_chain else rows,
            tokens, n, final, u8(valid) if has_chain else n, max_drafts + 1, HAS_CHAIN=has_chain,
            BLOCK_D=max(MIN_BLOCK_D, triton.next_power_of_2(max_drafts + 1)))
    return tokens, n, final, valid


@triton.jit(do_not_specialize=["ids_ptr", "inputs_ptr", "seg_ptr", "src_ptr", "counts_ptr", "num_tokens"])
def _verify_token_rows_kernel(ids_ptr, inputs_ptr, seg_ptr, src_ptr, last_ptr, ok_ptr, counts_ptr,
                              num_tokens, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)  # a token row: work only where a request starts
    seg = tl.load(seg_ptr + i)
    first = seg >= 0
    d = tl.where(first, seg >> 1, 0)
    j = tl.arange(0, BLOCK_D)
    inside = (j < d) & (i + j + 1 < num_tokens)
    draft = tl.load(inputs_ptr + i + j + 1, mask=inside, other=0)
    # a draft is accepted where it is the token drawn before it (the argmax, or the seeded draw)
    rejected = tl.load(ids_ptr + i + j, mask=inside, other=0) != draft
    n = tl.min(tl.where(inside & rejected, j, d), axis=0)  # the first rejection, else d
    row = tl.load(src_ptr + i, mask=first, other=0)
    chained = first & ((seg & 1) == 1)
    valid = tl.load(ok_ptr + row, mask=chained, other=1) != 0  # (unchained rows: valid)
    final = tl.load(ids_ptr + i + n, mask=first, other=0)
    tl.store(ok_ptr + row, (valid & (n == d)).to(tl.uint8), mask=first)
    tl.store(last_ptr + row, final, mask=first & valid)
    tl.store(counts_ptr + i, tl.where(first & valid, n + 1, 0).to(tl.int64))


def verify_token_rows_triton(ids, input_ids, segments, src_rows, last_tokens, chain_ok, counts) -> None:
    """kernels.verify_token_rows on CUDA tensors (the reference's contract; up to MIN_BLOCK_D - 1
    drafts a request: graph-capturable, no host sync)."""
    check_same_device(ids=ids, input_ids=input_ids, segments=segments, src_rows=src_rows,
                      last_tokens=last_tokens, chain_ok=chain_ok, counts=counts)
    t = ids.numel()
    if t:
        _verify_token_rows_kernel[(t,)](
            ids, input_ids, segments, src_rows, last_tokens, chain_ok.view(torch.uint8), counts, t,
            BLOCK_D=MIN_BLOCK_D)
