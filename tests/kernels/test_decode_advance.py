"""The steady decode step's advance: its reference against the rule written row by row (CPU), and
the Triton kernel against the reference, exactly (CUDA, or TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference_advance import decode_advance_reference
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS

MAX_BLOCKS = 12


def _case(seed: int, rows: int, padded: int, num_gained: int, block_size: int, sample: bool = True):
    """A layout of `padded` rows, the first `rows` advancing; `num_gained` of them gain a block
    at the column their next position needs (a row gains at most one)."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, (MAX_BLOCKS - 1) * block_size, (padded,), generator=g)
    gainers = torch.randperm(rows, generator=g)[:num_gained]
    pos[gainers] = (torch.randint(0, MAX_BLOCKS - 1, (num_gained,), generator=g) + 1) * block_size - 1
    tables = torch.randint(1, 1000, (padded, MAX_BLOCKS), generator=g, dtype=torch.int64).to(torch.int32)
    cols = (pos[gainers] + 1) // block_size
    tables[gainers, cols] = 0  # not there yet: the gained block writes it
    gained = torch.stack([gainers, cols, torch.randint(1, 1000, (num_gained,), generator=g)]).contiguous()
    return dict(positions=pos, seq_lens=(pos + 1).to(torch.int32), slot_mapping=torch.full((padded,), -7),
                block_tables=tables, sample_positions=pos + 1 if sample else None, gained=gained,
                num_rows=rows, block_size=block_size)


def _clone(c: dict, device="cpu") -> dict:
    return {k: (v.clone().to(device) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}


def test_the_reference_follows_the_rule():
    c = _case(0, rows=9, padded=16, num_gained=3, block_size=16)
    before = _clone(c)
    decode_advance_reference(**c)
    for i in range(16):
        if i >= 9:  # padding: untouched
            for k in ("positions", "seq_lens", "slot_mapping", "sample_positions", "block_tables"):
                assert torch.equal(c[k][i], before[k][i]), k
            continue
        p = int(before["positions"][i]) + 1
        assert int(c["positions"][i]) == p and int(c["seq_lens"][i]) == p + 1 and int(c["sample_positions"][i]) == p + 1
        table = before["block_tables"][i].clone()
        for row, col, block in before["gained"].t().tolist():
            if row == i:
                table[col] = block
        assert torch.equal(c["block_tables"][i], table)
        assert int(c["slot_mapping"][i]) == int(table[p // 16]) * 16 + p % 16
    assert all(int(c["slot_mapping"][r]) == int(before["gained"][2][k]) * 16  # a gained block's first slot
               for k, r in enumerate(before["gained"][0].tolist()))


@pytest.mark.parametrize("seed,rows,padded,num_gained,block_size,sample", [
    (1, 1, 1, 0, 16, True), (2, 1, 2, 1, 16, True), (3, 7, 8, 2, 16, False), (4, 64, 64, 64, 16, True),
    (5, 300, 320, 17, 32, True), (6, 513, 520, 300, 16, True), (7, 40, 48, 0, 8, True)])
@TRITON_MARKS[0]
@TRITON_MARKS[1]
def test_the_kernel_matches_the_reference(seed, rows, padded, num_gained, block_size, sample):
    import kernels
    from kernels.decode_step import decode_advance_triton

    c = _case(seed, rows, padded, num_gained, block_size, sample)
    ref, dev = _clone(c), _clone(c, DEVICE)
    decode_advance_reference(**ref)
    (kernels.decode_advance if ON_CUDA else decode_advance_triton)(**dev, max_rows=max(rows, 520))
    for k, v in ref.items():
        if isinstance(v, torch.Tensor):
            assert dev[k].dtype == v.dtype and torch.equal(dev[k].cpu(), v), k


@TRITON_MARKS[0]
@TRITON_MARKS[1]
def test_the_kernel_refuses_more_rows_or_blocks_than_its_lanes():
    from kernels.decode_step import decode_advance_triton

    c = _clone(_case(8, rows=20, padded=24, num_gained=0, block_size=16), DEVICE)
    with pytest.raises(ValueError, match="at most 16"):  # more rows than max_rows
        decode_advance_triton(**c, max_rows=16)
    c["gained"] = torch.zeros(3, 33, dtype=torch.int64, device=DEVICE)  # more blocks than the 32 lanes
    with pytest.raises(ValueError, match="at most 20 and 32"):
        decode_advance_triton(**c, max_rows=20)
    c["seq_lens"] = c["seq_lens"].long()
    with pytest.raises(ValueError, match="int32 seq lens"):
        decode_advance_triton(**{**c, "gained": torch.zeros(3, 0, dtype=torch.int64, device=DEVICE)}, max_rows=20)
