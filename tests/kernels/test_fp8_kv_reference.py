"""FP8 (float8_e4m3fn) KV caches in the references (the specification), CPU: the write's
quantization (precision, exact points, scales, clamping, rounding, skipped slots), the read's
dequantization, attention over an FP8 cache = attention over the dequantized cache, exactly."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import (
    FP8,
    dense_attention,
    fp8_case,
    make_case,
    rel_err,
)

SCALES = [0.5, 0.013, 3.0]


def _write_read(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H, D] written to slots 0..T-1 of FP8 caches (K and V get the same x and scale) and
    read back: (the stored e4m3 cache [T, H, D], the dequantized float32 values)."""
    t, h, d = x.shape
    k_cache = torch.full((t // 4 + 1, 4, h, d), float("nan")).to(FP8)
    v_cache = k_cache.clone()
    s = torch.tensor([scale])
    kernels.write_kv(x, x, k_cache, v_cache, torch.arange(t), s, s)
    stored = k_cache.view(-1, h, d)[:t]
    assert torch.equal(stored.view(torch.uint8), v_cache.view(-1, h, d)[:t].view(torch.uint8))
    return stored, ref.dequantize_kv_reference(stored, s)


@pytest.mark.parametrize("scale", SCALES)
def test_roundtrip_error_is_bounded_by_e4m3_precision(scale):
    gen = torch.Generator().manual_seed(int(scale * 1000))
    x = torch.randn(64, 2, 32, generator=gen) * 40 * scale  # |x / scale| well inside 448
    _, back = _write_read(x, scale)
    q = (x / scale).abs()
    normal = q >= 2.0 ** -6  # e4m3's smallest normal
    assert normal.float().mean() > 0.95
    # 3 mantissa bits, round to nearest: relative error <= 2^-4 for normal values
    assert ((back - x).abs()[normal] <= 2.0 ** -4 * x.abs()[normal] * (1 + 1e-6)).all()
    # subnormals: steps of 2^-9, so at most half a step (times the scale)
    assert ((back - x).abs()[~normal] <= 2.0 ** -10 * scale * (1 + 1e-6)).all()
    assert rel_err(back, x) < 2.0 ** -4


@pytest.mark.parametrize("scale", [0.5, 4.0])  # powers of two: x = v * scale and x / scale are exact
def test_representable_points_are_exact(scale):
    codes = torch.arange(256, dtype=torch.uint8)
    values = codes.view(FP8).float()
    finite = ~torch.isnan(values)  # 0x7F and 0xFF are NaN in e4m3fn
    v = values[finite]
    x = (v * scale).reshape(-1, 1, 1).repeat(1, 1, 16)  # [254, 1, 16]
    stored, back = _write_read(x, scale)
    assert torch.equal(back, x)
    assert torch.equal(stored[:, 0, 0].view(torch.uint8), codes[finite])


def test_scales_clamping_and_round_to_nearest_even():
    scale = 0.25
    q = torch.tensor([1e6, -1e6, 448.0, 449.0, 470.0, -500.0,  # clamped to +-448
                      1.0 + 2 ** -4, 1.0 + 3 * 2 ** -4,  # halfway: to the even mantissa, 1.0 and 1.25
                      2.0 ** -10, 3 * 2.0 ** -10, 0.0, -0.0])  # subnormal halfway cases: 0 and 2^-8
    x = (q * scale).reshape(-1, 1, 1).repeat(1, 1, 16)
    _, back = _write_read(x, scale)
    want = torch.tensor([448.0, -448.0, 448.0, 448.0, 448.0, -448.0, 1.0, 1.25, 0.0, 2.0 ** -8, 0.0, 0.0]) * scale
    assert torch.equal(back[:, 0, 0], want)
    assert torch.equal(ref.quantize_kv_reference(x, FP8, torch.tensor([scale])).float() * scale, back)


def test_negative_slots_skipped_and_other_caches_ignore_scales():
    gen = torch.Generator().manual_seed(3)
    key, value = torch.randn(9, 2, 16, generator=gen), torch.randn(9, 2, 16, generator=gen)
    slots = torch.tensor([5, -1, 0, 17, -1, 30, 2, 3, 9])
    k8, v8 = torch.full((4, 8, 2, 16), float("nan")).to(FP8), torch.full((4, 8, 2, 16), float("nan")).to(FP8)
    ks, vs = torch.tensor([0.1]), torch.tensor([0.2])
    ref.write_kv_reference(key, value, k8, v8, slots, ks, vs)
    keep = slots >= 0
    flat_k, flat_v = k8.view(-1, 2, 16).float(), v8.view(-1, 2, 16).float()
    written = torch.zeros(32, dtype=torch.bool)
    written[slots[keep]] = True
    assert torch.isnan(flat_k[~written]).all() and torch.isnan(flat_v[~written]).all()
    assert torch.equal(flat_k[slots[keep]], (key[keep] / 0.1).clamp(-448, 448).to(FP8).float())
    assert torch.equal(flat_v[slots[keep]], (value[keep] / 0.2).clamp(-448, 448).to(FP8).float())
    # a float32 cache stores the values as they are, whatever the scales
    plain, scaled = [torch.zeros(4, 8, 2, 16) for _ in range(2)], [torch.zeros(4, 8, 2, 16) for _ in range(2)]
    ref.write_kv_reference(key, value, *plain, slots)
    ref.write_kv_reference(key, value, *scaled, slots, ks, vs)
    assert torch.equal(plain[0], scaled[0]) and torch.equal(plain[1], scaled[1])
    assert torch.equal(plain[0].view(-1, 2, 16)[slots[keep]], key[keep])


def test_fp8_cache_without_scales_is_a_value_error():
    case = make_case([3, 1], [3, 9], 4, 2, 16, 8, torch.float32, "cpu")
    c, _, (ks, vs) = fp8_case(case, 0.1, 0.1)
    with pytest.raises(ValueError, match="FP8 .* needs k_scale"):
        kernels.write_kv(c.q[:, :2], c.q[:, :2], c.k_cache, c.v_cache, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="needs v_scale"):
        kernels.paged_attention(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.query_start_loc,
                                c.scale, 3, 9, None, ks)
    with pytest.raises(ValueError, match="float32"):
        kernels.paged_decode_attention(c.q[:2], c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale,
                                       None, ks.half(), vs)


@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("num_heads,num_kv_heads,block_size", [(4, 4, 8), (8, 2, 16)])
def test_attention_over_fp8_cache_equals_attention_over_the_dequantized_cache(window, num_heads, num_kv_heads,
                                                                              block_size):
    q_lens, seq_lens = [40, 7, 1, 0, 1], [40, 60, 33, 12, 0]  # prefill, chunk, decode, empty, padded
    case = make_case(q_lens, seq_lens, num_heads, num_kv_heads, 32, block_size, torch.float32, "cpu", seed=window,
                     sliding_window=window)
    c, dense, (ks, vs) = fp8_case(case, 0.03, 0.7)
    out = kernels.paged_attention(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.query_start_loc,
                                  c.scale, 40, 60, window or None, ks, vs)
    want = ref.paged_attention_reference(dense.q, dense.k_cache, dense.v_cache, dense.block_tables, dense.seq_lens,
                                         dense.query_start_loc, dense.scale, window or None)
    assert torch.equal(out, want) and not torch.isnan(out).any()
    assert rel_err(out, dense_attention(dense, window)) < 1e-5
    assert rel_err(out, dense_attention(case, window)) > 1e-4  # FP8 really changed the values
    decode = make_case([1] * 4, [70, 3, 0, 41], num_heads, num_kv_heads, 32, block_size, torch.float32, "cpu",
                       seed=7, sliding_window=window)
    c, dense, (ks, vs) = fp8_case(decode, 0.03, 0.7)
    out = kernels.paged_decode_attention(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale,
                                         window or None, ks, vs)
    want = ref.paged_decode_attention_reference(dense.q, dense.k_cache, dense.v_cache, dense.block_tables,
                                                dense.seq_lens, dense.scale, window or None)
    assert torch.equal(out, want) and torch.all(out[2] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_write_kv_reference_quantizes_what_the_unquantized_cache_holds(dtype):
    gen = torch.Generator().manual_seed(0)
    t, nh, nkv, d, max_pos = 11, 4, 2, 32, 64
    qkv = (torch.randn(t, (nh + 2 * nkv) * d, generator=gen) * 3).to(dtype)
    angles = torch.arange(max_pos).float()[:, None] / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions, slots = torch.randint(0, max_pos, (t,), generator=gen), torch.randperm(32, generator=gen)[:t]
    slots[3] = -1
    ks, vs = torch.tensor([0.02]), torch.tensor([0.05])
    k8, v8 = torch.zeros(4, 8, nkv, d, dtype=FP8), torch.zeros(4, 8, nkv, d, dtype=FP8)
    kd, vd = torch.zeros(4, 8, nkv, d, dtype=dtype), torch.zeros(4, 8, nkv, d, dtype=dtype)
    q8 = kernels.rotary_write_kv(positions, qkv, cos_sin, k8, v8, slots, nh, nkv, d, k_scale=ks, v_scale=vs)
    q = kernels.rotary_write_kv(positions, qkv, cos_sin, kd, vd, slots, nh, nkv, d)
    assert torch.equal(q8, q)
    assert torch.equal(k8.view(torch.uint8), ref.quantize_kv_reference(kd, FP8, ks).view(torch.uint8))
    assert torch.equal(v8.view(torch.uint8), ref.quantize_kv_reference(vd, FP8, vs).view(torch.uint8))


def test_fp8_decode_launch_configs_from_shapes():
    """FP8 caches get their own launches: twice the tokens per tile of bf16's at head dim 64 (the
    same bytes), splits counted in those tiles, never more than MAX_SPLITS; bf16 unchanged."""
    pytest.importorskip("triton")
    from kernels.attention_decode import MAX_SPLITS, DecodeConfig, decode_launch_config

    assert decode_launch_config(256, 8, 512, 132) == DecodeConfig(64, 1, 2, 3)  # bf16 as swept
    for batch in (1, 2, 8, 32, 64, 128, 256, 1024):
        for head_dim in (64, 128):
            for ctx in (16, 512, 4096):
                cfg = decode_launch_config(batch, 8, ctx, 132, head_dim, fp8=True)
                assert cfg.block_n == (128 if head_dim == 64 else 64) and cfg.num_warps in (4, 8)
                assert 1 <= cfg.num_splits <= min(MAX_SPLITS, -(-ctx // cfg.block_n))
                if batch * 8 >= 3 * 132:
                    assert cfg.num_splits == 1
