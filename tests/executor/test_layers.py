"""The capturable torch decode attention (CUDA fallback) agrees with the kernel reference."""

from __future__ import annotations

import torch

from executor_svc.layers import paged_decode_attention_torch
from kernels.reference import paged_decode_attention_reference


def test_decode_attention_torch_matches_reference():
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(10, 4, 2, 8, generator=g), torch.randn(10, 4, 2, 8, generator=g)
    q = torch.randn(3, 4, 8, generator=g)  # 4 query heads over 2 KV heads
    tables = torch.tensor([[3, 5, 1], [2, 0, 0], [0, 0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([10, 3, 0], dtype=torch.int32)  # last row padded
    out = paged_decode_attention_torch(q, k_cache, v_cache, tables, seq_lens, 0.3)
    ref = paged_decode_attention_reference(q, k_cache, v_cache, tables, seq_lens, 0.3)
    torch.testing.assert_close(out, ref)
    assert out[2].abs().sum() == 0
