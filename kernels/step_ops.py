"""The executor's per-step bookkeeping on the device (re-exported by kernels/__init__.py): the
rejection rule and verify scan of speculative decoding and the steady decode step's advance.
Triton on CUDA tensors, their plain-torch references otherwise."""

from __future__ import annotations

import torch

TOKEN_ROWS_MAX_DRAFTS = 15  # kernels/spec_verify.py: one Triton variant, up to 15 drafts a request


def decode_advance(
    positions: torch.Tensor,  # [>= b] int64, in/out
    seq_lens: torch.Tensor,  # [>= b] int32, in/out
    slot_mapping: torch.Tensor,  # [>= b] int64, out
    block_tables: torch.Tensor,  # [>= b, max_blocks] int32, in/out
    sample_positions: torch.Tensor | None,  # [>= b] int64, in/out (None: not moved)
    gained: torch.Tensor,  # [3, G] int64: (row, column, block id)
    num_rows: int,
    block_size: int,
    max_rows: int,  # the most rows any call passes (one Triton variant per value); G <= its next power of 2
) -> None:
    """The rows of the last decode step, one token further, in place: the gained blocks written,
    then positions, seq lens and sample positions + 1 and the slots of the new positions
    (kernels/reference_advance.py says exactly what)."""
    if positions.is_cuda:
        from kernels.decode_step import decode_advance_triton

        return decode_advance_triton(positions, seq_lens, slot_mapping, block_tables, sample_positions, gained,
                                     num_rows, block_size, max_rows)
    from kernels.reference_advance import decode_advance_reference

    return decode_advance_reference(positions, seq_lens, slot_mapping, block_tables, sample_positions, gained,
                                    num_rows, block_size)


def verify_scan(
    accepted: torch.Tensor,  # [D] bool
    recovered: torch.Tensor,  # [D] int64
    draft_ids: torch.Tensor,  # [D] int64
    draft_start: torch.Tensor,  # [S] int64
    num_drafts: torch.Tensor,  # [S] int64, >= 1
    rows: torch.Tensor,  # [S] int64, distinct
    last_tokens: torch.Tensor,  # [R] int64, in/out
    chain_ok: torch.Tensor,  # [R] bool, in/out
    chained: torch.Tensor | None,  # [S] bool
    prev_last: torch.Tensor | None,  # [S] int64 (with chained)
    max_drafts: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Speculative decoding's accept scan per verify row: (tokens [S, max_drafts + 1], accepted
    counts [S], final tokens [S], valid [S] or None); writes chain_ok and last_tokens of the rows
    (kernels/reference_verify.py says exactly what)."""
    if rows.is_cuda:
        from kernels.spec_verify import verify_scan_triton

        return verify_scan_triton(accepted, recovered, draft_ids, draft_start, num_drafts, rows, last_tokens,
                                  chain_ok, chained, prev_last, max_drafts)
    from kernels.reference_verify import verify_scan_reference

    return verify_scan_reference(accepted, recovered, draft_ids, draft_start, num_drafts, rows, last_tokens,
                                 chain_ok, chained, prev_last, max_drafts)


def verify_token_rows(
    ids: torch.Tensor,  # [T] int64, in/out: each token row's token (its argmax, or seeded draw)
    input_ids: torch.Tensor,  # [T] int64
    segments: torch.Tensor,  # [T] int32: (d << 1) | chained at a request's first token, < 0 elsewhere
    src_rows: torch.Tensor,  # [T] int64
    last_tokens: torch.Tensor,  # [R] int64, in/out
    chain_ok: torch.Tensor,  # [R] bool, in/out
    counts: torch.Tensor,  # [T] int64, out
) -> None:
    """A verify step of token rows in one pass: each request's accepted drafts (its tokens in
    place in ids), its tokens' count at its first token, its chain flag and last token (at most
    TOKEN_ROWS_MAX_DRAFTS drafts a request on CUDA; kernels/reference_verify.py says exactly what)."""
    if ids.is_cuda:
        from kernels.spec_verify import verify_token_rows_triton

        return verify_token_rows_triton(ids, input_ids, segments, src_rows, last_tokens, chain_ok, counts)
    from kernels.reference_verify import verify_token_rows_reference

    return verify_token_rows_reference(ids, input_ids, segments, src_rows, last_tokens, chain_ok, counts)
