"""FP8 (float8_e4m3fn) KV caches in the Triton kernels against the references on the same FP8 cache:
write_kv and rotary_write_kv (bit-equal / within the dtype's tolerance), decode (splits, sliding
window, tuning overrides, a CUDA graph replayed with new scales) and varlen attention. Runs on
CUDA; under TRITON_INTERPRET=1 only the attention tests run (the interpreter's float32 -> e4m3
conversion mis-rounds values that round up to a power of two, e.g. 7.9 -> 4.0, so the write
tests need a GPU)."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import reference as ref
from tests.kernels.kernel_cases import (
    DEVICE,
    DTYPES,
    FP8,
    ON_CUDA,
    POISON,
    TRITON_MARKS,
    dense_attention,
    fp8_case,
    make_case,
    mixed_lens,
    rel_err,
    tier,
    tolerance,
)

pytestmark = TRITON_MARKS

K_SCALE, V_SCALE = 0.02, 0.5  # randn K / 0.02 reaches ~250 of e4m3's 448; V is scaled too
needs_gpu_fp8_writes = pytest.mark.skipif(not ON_CUDA, reason="the interpreter mis-rounds float32 -> e4m3")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def _scales(device=DEVICE):
    return (torch.tensor([K_SCALE], device=device), torch.tensor([V_SCALE], device=device))


@needs_gpu_fp8_writes
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(8, 64), (2, 128), (3, 64)])
def test_write_kv_fp8_bit_equal_to_reference(dtype, num_kv_heads, head_dim):
    from kernels.cache import write_kv_triton

    num_blocks, block_size, num_tokens = 20, 16, 50
    gen = torch.Generator().manual_seed(head_dim + num_kv_heads)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::7] = -1
    key = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 3).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    key[0, 0, :4] = torch.tensor([1e4, -1e4, 448 * K_SCALE, 0.0])  # clamped, clamped, exact max, zero
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, POISON).to(FP8) for _ in range(4)]
    ks, vs = _scales("cpu")
    ref.write_kv_reference(key, value, caches[0], caches[1], slots, ks, vs)
    k_dev, v_dev = caches[2].to(DEVICE), caches[3].to(DEVICE)
    write_kv_triton(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slots.to(torch.int32).to(DEVICE),
                    *_scales())
    assert torch.equal(_bits(k_dev), _bits(caches[0])) and torch.equal(_bits(v_dev), _bits(caches[1]))


@needs_gpu_fp8_writes
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm,is_neox", [(False, True), (True, True), (False, False)])
def test_rotary_write_kv_fp8(dtype, qk_norm, is_neox):
    from kernels.rotary_cache import rotary_write_kv_triton
    from tests.kernels.test_triton_rotary_cache import _rotary_write_kv_case

    num_tokens, num_heads, num_kv_heads, head_dim = 37, 16, 4, 128
    positions, qkv, cos_sin_cache, slots, shape, (q_w, k_w) = _rotary_write_kv_case(
        num_tokens, num_heads, num_kv_heads, head_dim, dtype, qk_norm, seed=head_dim)
    k_exp, v_exp = torch.full(shape, POISON).to(FP8), torch.full(shape, POISON).to(FP8)
    ks, vs = _scales("cpu")
    q_exp = ref.rotary_write_kv_reference(positions, qkv, cos_sin_cache, k_exp, v_exp, slots, num_heads,
                                          num_kv_heads, head_dim, is_neox, q_w, k_w, 1e-6, ks, vs)
    dev = lambda t: None if t is None else t.to(DEVICE)
    k_dev, v_dev = dev(torch.full(shape, POISON).to(FP8)), dev(torch.full(shape, POISON).to(FP8))
    q = rotary_write_kv_triton(dev(positions), dev(qkv), dev(cos_sin_cache), k_dev, v_dev, dev(slots), num_heads,
                               num_kv_heads, head_dim, is_neox, dev(q_w), dev(k_w), 1e-6, k_scale=dev(ks),
                               v_scale=dev(vs))
    assert rel_err(q, q_exp) < tolerance(dtype)
    written = slots[slots >= 0].long()
    flat = lambda c: c.cpu().view(-1, num_kv_heads, head_dim)
    # K: the rotation may round differently by an ulp of the dtype, which can move an e4m3 step
    k_got, k_want = ref.dequantize_kv_reference(flat(k_dev)[written], ks), ref.dequantize_kv_reference(flat(k_exp)[written], ks)
    assert not torch.isnan(k_got).any() and rel_err(k_got, k_want) < 2e-2
    assert torch.equal(_bits(flat(v_dev)[written]), _bits(flat(v_exp)[written]))  # V: the same quantization
    untouched = torch.ones(flat(k_dev).shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.isnan(flat(k_dev)[untouched].float()).all() and torch.isnan(flat(v_dev)[untouched].float()).all()


def _check_attention(out, quantized, dense, ks, vs, dtype, window=0, decode=True):
    """out vs the SDPA of the dequantized case and vs the reference on the FP8 cache itself."""
    assert not torch.isnan(out).any(), "unwritten output, or a NaN block read"
    assert rel_err(out, dense_attention(dense, window)) < tolerance(dtype)
    c = quantized
    if decode:
        want = ref.paged_decode_attention_reference(c.q.cpu(), c.k_cache.cpu(), c.v_cache.cpu(), c.block_tables.cpu(),
                                                    c.seq_lens.cpu(), c.scale, window, ks.cpu(), vs.cpu())
    else:
        want = ref.paged_attention_reference(c.q.cpu(), c.k_cache.cpu(), c.v_cache.cpu(), c.block_tables.cpu(),
                                             c.seq_lens.cpu(), c.query_start_loc.cpu(), c.scale, window,
                                             ks.cpu(), vs.cpu())
    assert rel_err(out, want) < tolerance(dtype)


# (dtype index, head_dim, num_heads, num_kv_heads, block_size)
FP8_ATTENTION_CONFIGS = tier([(0, 64, 32, 8, 16), (1, 128, 16, 8, 16), (0, 128, 12, 2, 8), (1, 64, 8, 8, 32)],
                             [(0, 128, 12, 2, 8), (1, 64, 8, 8, 32)])  # the fast tier: block sizes 8, 32


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads,block_size", FP8_ATTENTION_CONFIGS)
@pytest.mark.parametrize("window", [0, 37])
def test_decode_attention_fp8(dtype_index, head_dim, num_heads, num_kv_heads, block_size, window):
    from kernels.attention_decode import paged_decode_attention_triton

    dtype = DTYPES[dtype_index]
    rng = random.Random(head_dim + num_heads + window)
    batch = 9 if ON_CUDA else 3
    seq_lens = [rng.randint(1, 3000 if ON_CUDA else 150) for _ in range(batch)]
    seq_lens[1] = 0  # a padded row
    case = make_case([1] * batch, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, DEVICE,
                     seed=window + block_size, sliding_window=window)
    quantized, dense, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    c = quantized
    for num_splits in (None, 1, 5):
        out = torch.full_like(c.q, POISON)
        paged_decode_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale,
                                      num_splits=num_splits, out=out, sliding_window=window or None,
                                      k_scale=ks, v_scale=vs)
        _check_attention(out, quantized, dense, ks, vs, dtype, window)
        assert torch.all(out[1] == 0)


@pytest.mark.parametrize("overrides", [{"block_n": 16, "num_warps": 2, "num_stages": 2},
                                       {"num_splits": 3, "block_n": 64}, {"num_warps": 8, "num_stages": 4}])
def test_decode_attention_fp8_tuning_overrides(overrides):
    from kernels.attention_decode import paged_decode_attention_triton

    dtype = DTYPES[0]
    case = make_case([1] * 4, [1, 300, 77, 129], 16, 4, 64, 16, dtype, DEVICE, seed=5)
    quantized, dense, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    c = quantized
    out = paged_decode_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale,
                                        k_scale=ks, v_scale=vs, **overrides)
    _check_attention(out, quantized, dense, ks, vs, dtype)


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads,block_size", FP8_ATTENTION_CONFIGS)
@pytest.mark.parametrize("window", [0, 37])
def test_paged_attention_varlen_fp8(dtype_index, head_dim, num_heads, num_kv_heads, block_size, window):
    from kernels.attention_prefill import paged_attention_triton

    dtype = DTYPES[dtype_index]
    rng = random.Random(head_dim * 3 + num_heads + window)
    max_ctx = 2000 if ON_CUDA else 140
    q_lens, seq_lens = mixed_lens(rng, ["prefill", "chunk", "decode", "padded", "chunk", "decode"], max_ctx)
    case = make_case(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, DEVICE,
                     seed=window + head_dim, sliding_window=window)
    quantized, dense, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    c = quantized
    out = torch.full_like(c.q, POISON)
    paged_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.query_start_loc, c.scale,
                           c.max_query_len, out=out, sliding_window=window or None, k_scale=ks, v_scale=vs)
    _check_attention(out, quantized, dense, ks, vs, dtype, window, decode=False)


def test_fp8_cache_without_scales_is_refused():
    from kernels.attention_decode import paged_decode_attention_triton
    from kernels.attention_prefill import paged_attention_triton
    from kernels.cache import write_kv_triton

    case = make_case([1, 1], [10, 20], 8, 2, 64, 16, DTYPES[0], DEVICE)
    c, _, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    with pytest.raises(ValueError, match="k_scale"):
        paged_decode_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale)
    with pytest.raises(ValueError, match="v_scale"):
        paged_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.query_start_loc,
                               c.scale, 1, k_scale=ks)
    with pytest.raises(ValueError, match="float32"):
        write_kv_triton(c.q[:, :2], c.q[:, :2], c.k_cache, c.v_cache, c.seq_lens, ks.double(), vs)
    with pytest.raises(ValueError, match="v_cache"):  # K and V caches of different dtypes
        paged_decode_attention_triton(c.q, c.k_cache, case.v_cache, c.block_tables, c.seq_lens, c.scale,
                                      k_scale=ks, v_scale=vs)


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("window", [None, 100])
def test_decode_attention_fp8_cuda_graph_replay(window):
    """Captured once; replayed over new FP8 caches written with new scales into the same scale tensors."""
    import kernels

    batch, num_heads, num_kv_heads, head_dim = 8, 32, 8, 64
    first = make_case([1] * batch, [400] * batch, num_heads, num_kv_heads, head_dim, 16, torch.bfloat16, DEVICE,
                      seed=1)
    c0, _, (ks, vs) = fp8_case(first, K_SCALE, V_SCALE)
    q, k_cache, v_cache = c0.q.clone(), c0.k_cache.clone(), c0.v_cache.clone()
    block_tables, seq_lens = c0.block_tables.clone(), c0.seq_lens.clone()
    kernels.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, c0.scale, window, ks, vs)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, c0.scale, window, ks, vs)
    for seed, lens, scales in [(2, [5, 0, 290, 17, 1, 64, 0, 333], (0.05, 0.01)),
                               (3, [1, 2, 3, 4, 300, 200, 100, 16], (0.01, 2.0))]:
        case = make_case([1] * batch, lens, num_heads, num_kv_heads, head_dim, 16, torch.bfloat16, DEVICE,
                         seed=seed, sliding_window=window or 0)
        quantized, dense, (new_ks, new_vs) = fp8_case(case, *scales)
        assert case.k_cache.shape[0] <= k_cache.shape[0] and case.block_tables.shape[1] <= block_tables.shape[1]
        k_cache.view(torch.uint8).fill_(0x7F), v_cache.view(torch.uint8).fill_(0x7F), block_tables.zero_()  # NaN
        k_cache[: case.k_cache.shape[0]].copy_(quantized.k_cache)
        v_cache[: case.v_cache.shape[0]].copy_(quantized.v_cache)
        block_tables[:, : case.block_tables.shape[1]].copy_(case.block_tables)
        q.copy_(case.q), seq_lens.copy_(case.seq_lens), ks.copy_(new_ks), vs.copy_(new_vs)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, dense_attention(dense, window or 0)) < 1e-2


def _big_query_case(case, rows_scale):
    """The case with q's rows multiplied by rows_scale (values far past fp16's 65504 in some rows)."""
    from dataclasses import replace

    q = (case.q.float().cpu() * rows_scale[:, None, None]).to(case.q.dtype).to(case.q.device)
    return replace(case, q=q)


@pytest.mark.parametrize("decode", [True, False])
def test_fp8_attention_query_past_the_fp16_range(decode):
    """A bf16 q runs its products in fp16 over an FP8 cache: rows of |q| ~ 1e6 must not overflow
    (fp16_query's shift; the interpreter runs this test too: no bf16 tl.dot), and every row, huge
    or not, must match the reference."""
    from kernels.attention_decode import paged_decode_attention_triton
    from kernels.attention_prefill import paged_attention_triton

    dtype, big = torch.bfloat16, 4e5
    q_lens, seq_lens = ([1] * 4, [90, 33, 150, 7]) if decode else ([20, 1, 7], [60, 90, 7])
    case = make_case(q_lens, seq_lens, 16, 4, 64, 16, dtype, DEVICE, seed=11)
    t = case.q.shape[0]
    rows_scale = torch.ones(t)
    rows_scale[::2] = big  # even rows huge, odd rows normal
    case = _big_query_case(case, rows_scale)
    case.scale = case.scale / big ** 0.5  # huge rows: large but finite scores (1e6 / big^0.5 ~ 1e3)
    quantized, dense, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    c = quantized
    out = torch.full_like(c.q, POISON)
    if decode:
        paged_decode_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale, out=out,
                                      k_scale=ks, v_scale=vs)
    else:
        paged_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.query_start_loc, c.scale,
                               c.max_query_len, out=out, k_scale=ks, v_scale=vs)
    _check_attention(out, quantized, dense, ks, vs, dtype, decode=decode)


@pytest.mark.parametrize("batch", tier([1, 8, 64, 200], [1, 200]))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_attention_fp8_launch_configs(batch, head_dim):
    """Each FP8 launch decode_launch_config picks (llama-1b's 8 KV heads on an H200, the batch
    given) runs correctly; run here on a small case through the overrides."""
    from kernels.attention_decode import decode_launch_config, paged_decode_attention_triton

    cfg = decode_launch_config(batch, 8, 2048, 132, head_dim, fp8=True)
    case = make_case([1] * 3, [1, 300, 129], 16, 8, head_dim, 16, DTYPES[0], DEVICE, seed=batch)
    quantized, dense, (ks, vs) = fp8_case(case, K_SCALE, V_SCALE)
    c = quantized
    out = paged_decode_attention_triton(c.q, c.k_cache, c.v_cache, c.block_tables, c.seq_lens, c.scale,
                                        num_splits=min(cfg.num_splits, 5), block_n=cfg.block_n,
                                        num_warps=cfg.num_warps, num_stages=cfg.num_stages, k_scale=ks, v_scale=vs)
    _check_attention(out, quantized, dense, ks, vs, DTYPES[0])
