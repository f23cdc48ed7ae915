"""The steady decode step's advance in one Triton launch (reference: kernels/reference_advance.py).

Grid (1,): one program of BLOCK lanes (the next power of two of the most rows the caller ever
advances: its max_num_seqs) writes the gained blocks into the block tables, waits for its own
writes (a barrier: a CTA's global writes are visible to its threads after it), then moves every
row's position, seq len and sample position by one and computes its slot from the block table.
The row and gained counts are runtime arguments (never specialized; no loop over them, which
the interpreter could not run): one variant per service, compiled by the start-up warm-up. It
replaced the host's writes and the copy of positions, seq lens, slots and block tables at every
steady step (issue 26)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_rows", "num_gained", "bt_stride"])
def _decode_advance_kernel(pos_ptr, seq_ptr, slot_ptr, bt_ptr, samp_ptr, gained_ptr, num_rows, num_gained,
                           bt_stride, KV_BLOCK: tl.constexpr, HAS_SAMPLE: tl.constexpr, BLOCK: tl.constexpr):
    j = tl.arange(0, BLOCK)
    m = j < num_gained
    row = tl.load(gained_ptr + j, mask=m, other=0)
    col = tl.load(gained_ptr + num_gained + j, mask=m, other=0)
    block = tl.load(gained_ptr + 2 * num_gained + j, mask=m, other=0)
    tl.store(bt_ptr + row * bt_stride + col, block.to(tl.int32), mask=m)
    tl.debug_barrier()  # the gained blocks are read below, maybe by other threads of this program
    m = j < num_rows
    pos = tl.load(pos_ptr + j, mask=m, other=0) + 1
    tl.store(pos_ptr + j, pos, mask=m)
    tl.store(seq_ptr + j, tl.load(seq_ptr + j, mask=m, other=0) + 1, mask=m)
    if HAS_SAMPLE:
        tl.store(samp_ptr + j, tl.load(samp_ptr + j, mask=m, other=0) + 1, mask=m)
    block = tl.load(bt_ptr + j * bt_stride + pos // KV_BLOCK, mask=m, other=0).to(tl.int64)
    tl.store(slot_ptr + j, block * KV_BLOCK + pos % KV_BLOCK, mask=m)


def decode_advance_triton(positions, seq_lens, slot_mapping, block_tables, sample_positions, gained,
                          num_rows: int, block_size: int, max_rows: int) -> None:
    """kernels.decode_advance on CUDA tensors (the reference's contract). On the launch path of
    every steady step: the checks are the few that a wrong caller could pass unnoticed."""
    lanes = triton.next_power_of_2(max(max_rows, 16))
    if not (num_rows <= max_rows and gained.shape[1] <= lanes):
        raise ValueError(f"{num_rows} rows and {gained.shape[1]} gained blocks: at most {max_rows} and {lanes}")
    if not (positions.dtype == slot_mapping.dtype == gained.dtype == torch.int64
            and seq_lens.dtype == block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
            and gained.is_contiguous()):
        raise ValueError("int64 positions, slots and gained; int32 seq lens and row-major block tables")
    has_sample = sample_positions is not None
    _decode_advance_kernel[(1,)](
        positions, seq_lens, slot_mapping, block_tables, sample_positions if has_sample else positions, gained,
        num_rows, gained.shape[1], block_tables.stride(0), KV_BLOCK=block_size, HAS_SAMPLE=has_sample,
        BLOCK=lanes)
