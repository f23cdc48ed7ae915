"""The reference of the steady decode step's advance on the device (kernels/decode_step.py), in
plain torch: a step whose rows are the last step's, one token each, moves its inputs by one
position without the host writing them (executor_svc/worker/steady.py)."""

from __future__ import annotations

import torch


def decode_advance_reference(
    positions: torch.Tensor,  # [>= b] int64, in/out: each row's input position
    seq_lens: torch.Tensor,  # [>= b] int32, in/out
    slot_mapping: torch.Tensor,  # [>= b] int64, out
    block_tables: torch.Tensor,  # [>= b, max_blocks] int32, in/out
    sample_positions: torch.Tensor | None,  # [>= b] int64, in/out: the position each row samples at
    gained: torch.Tensor,  # [3, G] int64: (row, column, block id) of each block the rows gained
    num_rows: int,  # b
    block_size: int,
) -> None:
    """First writes the gained blocks into the block tables (block_tables[row, column] = id);
    then, for rows i < b: positions, seq_lens and sample_positions + 1, and the slot of the new
    position, block_tables[i, position // block_size] * block_size + position % block_size.
    Rows from b on are not touched (a padded graph's rows keep their padding)."""
    if gained.numel():
        block_tables[gained[0], gained[1]] = gained[2].to(block_tables.dtype)
    b = num_rows
    positions[:b] += 1
    seq_lens[:b] += 1
    if sample_positions is not None:
        sample_positions[:b] += 1
    pos = positions[:b]
    block = block_tables[:b].gather(1, (pos // block_size)[:, None]).squeeze(1).to(torch.int64)
    slot_mapping[:b] = block * block_size + pos % block_size
