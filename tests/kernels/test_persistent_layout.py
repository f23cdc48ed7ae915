"""kernels/persistent_layout.py: the persistent decode step's layer table holds each layer's eight
addresses in order, and refuses what the kernel cannot read: a wrong shape, a strided or other-dtype
tensor, mismatched caches, an address not 16-byte aligned (the kernel's loads are vectorized on
that promise). The counters cover the barriers and the attention splits' merge counts."""

from __future__ import annotations

import pytest
import torch

from kernels.persistent_layout import MAX_ROWS, STAGES, DecoderShape, counters, layer_table

SHAPE = DecoderShape(hidden=32, intermediate=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


def _layer(dtype=torch.float16):
    h, i, d = SHAPE.hidden, SHAPE.intermediate, SHAPE.head_dim
    q, kv = SHAPE.num_heads * d, SHAPE.num_kv_heads * d
    cache = (5, 16, SHAPE.num_kv_heads, d)
    return [torch.zeros(q + 2 * kv, h, dtype=dtype), torch.zeros(h, q, dtype=dtype), torch.zeros(2 * i, h, dtype=dtype),
            torch.zeros(h, i, dtype=dtype), torch.zeros(h, dtype=dtype), torch.zeros(h, dtype=dtype),
            torch.zeros(cache, dtype=dtype), torch.zeros(cache, dtype=dtype)]


def test_the_table_holds_each_layer_s_addresses_in_order():
    layers = [_layer(), _layer()]
    table = layer_table(layers, SHAPE)
    assert table.dtype == torch.int64 and table.shape == (2, 8)
    assert table.tolist() == [[t.data_ptr() for t in layer] for layer in layers]


def test_an_address_off_16_bytes_is_refused():
    layers = [_layer(), _layer()]
    storage = torch.zeros(SHAPE.hidden + 1, dtype=torch.float16)
    layers[1][4] = storage[1:]  # contiguous, the right shape, 2 bytes past an aligned start
    with pytest.raises(ValueError, match="16-byte aligned"):
        layer_table(layers, SHAPE)


@pytest.mark.parametrize("spoil", ["shape", "layers", "strided", "dtype", "cache"])
def test_what_the_kernel_cannot_read_is_refused(spoil):
    layers = [_layer(), _layer()]
    if spoil == "shape":
        layers[0][2] = torch.zeros(2 * SHAPE.intermediate + 1, SHAPE.hidden, dtype=torch.float16)
    elif spoil == "layers":
        layers = layers[:1]
    elif spoil == "strided":
        layers[1][0] = layers[1][0].t().contiguous().t()
    elif spoil == "dtype":
        layers[1][3] = layers[1][3].float()
    else:
        layers[1][7] = layers[1][7][:4]
    with pytest.raises(ValueError):
        layer_table(layers, SHAPE)


def test_counters_cover_the_barriers_and_the_split_counts():
    assert counters(SHAPE) == SHAPE.num_layers * STAGES + 3 + MAX_ROWS * SHAPE.num_kv_heads
