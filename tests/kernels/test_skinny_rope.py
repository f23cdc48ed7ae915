"""The fused input norm + qkv skinny GEMM + rotary + KV write (kernels/skinny_rope.py): its reference
is the unfused references (CPU, always); the Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1
with fp16/fp32 and small shapes) is bit-identical to the unfused Triton pair (rms_norm_linear_triton
with the same config, then rotary_write_kv_triton) and close to the reference, writes only the
cache rows of non-negative slots, and refuses what it does not cover. (Interpreted, tl.dot is
numpy's matmul, whose fp32 sums may differ in the last bit with a column's place in the tile; the
fp16 outputs of these fixed cases round that away, fp32 ones are compared bitwise for the GEMV.)"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, POISON, TRITON_MARKS, rel_err, tier, tolerance

EPS = 1e-5
DTYPE = torch.bfloat16 if ON_CUDA else torch.float16  # the interpreter's tl.dot mishandles bf16
K = 2048 if ON_CUDA else 96  # interpreted: two K tiles of 64, the second partial
# (num_heads, num_kv_heads, head_dim): GQA 2:1 at D = 64, 3:1 at D = 32; llama-1b's on the GPU
HEADS = [(4, 2, 64), (3, 1, 32)] + ([(32, 8, 64)] if ON_CUDA else [])
BLOCK_SIZE, MAX_POS = 8, 256


def triton_test(fn):
    """The marks of every Triton test (tests/kernels/kernel_cases.py)."""
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def _rand(*shape, dtype, scale=1.0, gen):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def _case(m, heads, dtype, negative_rows=(), seed=0):
    """(x, residual, norm_weight, w, bias, positions, cos_sin_cache, slots, cache_shape) on DEVICE:
    distinct slots over a few blocks, -1 at negative_rows."""
    hq, hk, d = heads
    gen = torch.Generator().manual_seed(seed)
    x, r = _rand(m, K, dtype=dtype, gen=gen), _rand(m, K, dtype=dtype, gen=gen)
    nw = _rand(K, dtype=dtype, scale=0.2, gen=gen).add_(1.0)
    w = _rand((hq + 2 * hk) * d, K, dtype=dtype, scale=0.05, gen=gen)
    bias = _rand((hq + 2 * hk) * d, dtype=dtype, gen=gen)
    positions = torch.randint(0, MAX_POS, (m,), generator=gen)
    angles = torch.arange(MAX_POS).float()[:, None] / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
    num_blocks = m // BLOCK_SIZE + 3
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:m]
    slots[list(negative_rows)] = -1
    return (x, r, nw, w, bias, positions.to(DEVICE), cos_sin.to(DEVICE), slots.to(DEVICE),
            (num_blocks, BLOCK_SIZE, hk, d))


def _caches(shape, dtype):
    return [torch.full(shape, POISON, dtype=dtype, device=DEVICE) for _ in range(2)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().flatten().view(torch.uint8)  # NaN poison compares equal too


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


# --- references: always run -------------------------------------------------------------------

@pytest.mark.parametrize("with_residual", [False, True])
def test_reference_is_the_unfused_references_and_the_cpu_dispatch(with_residual):
    heads = (4, 2, 16)
    x, r, nw, w, b, pos, cs, slots, shape = (t.cpu() if isinstance(t, torch.Tensor) else t
                                             for t in _case(5, heads, torch.float32, negative_rows=(2,)))
    r = r if with_residual else None
    k1, v1 = (c.cpu() for c in _caches(shape, torch.float32))
    qkv, want_r = ref.rms_norm_linear_reference(x, r, nw, EPS, w, b)
    want_q = ref.rotary_write_kv_reference(pos, qkv, cs, k1, v1, slots, *heads)
    for fn in (ref.rms_norm_qkv_rope_reference, kernels.rms_norm_qkv_rope):
        k2, v2 = (c.cpu() for c in _caches(shape, torch.float32))
        q, new_r = fn(x, r, nw, EPS, w, b, pos, cs, k2, v2, slots, *heads)
        assert torch.equal(q, want_q) and torch.equal(new_r, want_r)
        assert _same_bits(k2, k1) and _same_bits(v2, v1)


# --- the Triton kernel ------------------------------------------------------------------------

def _configs(m, d):
    """The candidates that fit on CUDA; interpreted: a GEMV-only narrow one, 16 wide, one head wide
    and a CUDA-core one of 2+ rows."""
    from kernels.skinny_tune import CONFIGS, SkinnyConfig, fits, rope_fits

    if ON_CUDA:
        return [c for c in CONFIGS if fits(c, m, K) and rope_fits(c, d)]
    cc = [SkinnyConfig(8, 64, 4, 1, 1, False)] if m > 1 else []  # 2+ rows on CUDA cores
    return [SkinnyConfig(bn, 64, 4, 1, 1) for bn in ([8] if m == 1 else []) + [16, d]] + cc


def _run_both(cfg, x, r, nw, w, b, pos, cs, slots, shape, heads):
    """(fused outputs, unfused-pair outputs): each (q, new residual, k_cache, v_cache)."""
    from kernels.rotary_cache import rotary_write_kv_triton
    from kernels.skinny_gemm import rms_norm_linear_triton
    from kernels.skinny_rope import rms_norm_qkv_rope_triton

    k1, v1 = _caches(shape, x.dtype)
    fused = rms_norm_qkv_rope_triton(x, r, nw, EPS, w, b, pos, cs, k1, v1, slots, *heads, config=cfg)
    k2, v2 = _caches(shape, x.dtype)
    qkv, new_r = rms_norm_linear_triton(x, r, nw, EPS, w, b, cfg)
    q = rotary_write_kv_triton(pos, qkv, cs, k2, v2, slots, *heads)
    return (*fused, k1, v1), (q, new_r, k2, v2)


@pytest.mark.parametrize("hq,hk,d", tier(HEADS, [(4, 2, 64)]))
@pytest.mark.parametrize("m", tier([1, 3, 16], [1, 3]))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@triton_test
def test_fused_is_the_unfused_pair_bit_for_bit(m, hq, hk, d, with_bias, with_residual):
    heads = (hq, hk, d)
    negative = [i for i in range(m) if i % 3 == 1] if m > 1 else ([0] if with_bias else [])
    x, r, nw, w, b, pos, cs, slots, shape = _case(m, heads, DTYPE, negative, seed=m + heads[2])
    r, b = (r if with_residual else None), (b if with_bias else None)
    k_ref, v_ref = (c.cpu() for c in _caches(shape, DTYPE))
    q_ref, r_ref = ref.rms_norm_qkv_rope_reference(x.cpu(), None if r is None else r.cpu(), nw.cpu(), EPS,
                                                   w.cpu(), None if b is None else b.cpu(), pos.cpu(), cs.cpu(),
                                                   k_ref, v_ref, slots.cpu(), *heads)
    written = slots[slots >= 0].cpu()
    untouched = torch.ones(k_ref.shape[0] * BLOCK_SIZE, dtype=torch.bool)
    untouched[written] = False
    for cfg in _configs(m, heads[2]):
        fused, unfused = _run_both(cfg, x, r, nw, w, b, pos, cs, slots, shape, heads)
        names = ("q", "new residual", "k_cache", "v_cache")
        for name, got, want in zip(names, fused, unfused):
            assert _same_bits(got, want), f"{name} differs from the unfused pair, {cfg}"
        q, new_r, k, v = fused
        assert (new_r is x) if r is None else torch.equal(new_r.cpu(), r_ref)
        assert rel_err(q, q_ref) < tolerance(DTYPE), cfg
        for got, want in ((k, k_ref), (v, v_ref)):
            got, want = got.cpu().flatten(0, 1), want.flatten(0, 1)
            assert torch.isnan(got[untouched]).all(), f"a skipped or unused slot was written, {cfg}"
            if len(written):
                assert not torch.isnan(got[written]).any() and rel_err(got[written], want[written]) < tolerance(DTYPE)


@pytest.mark.parametrize("m", [1, 5])
@triton_test
def test_float32_and_the_chosen_config(m):
    """fp32 (no rounding between GEMM and rotation); config None (tuned on CUDA, else
    rope_default_config) matches the reference and repeats bit for bit. Interpreted, the tl.dot
    path is numpy's matmul, whose fp32 sums depend on a column's place in the tile (the last bit):
    fp32 bits are compared on CUDA and for the GEMV only (the fp16 sweep rounds that bit away)."""
    from kernels.skinny_tune import rope_default_config
    from kernels.skinny_rope import rms_norm_qkv_rope_triton

    heads = (4, 2, 64)
    x, r, nw, w, b, pos, cs, slots, shape = _case(m, heads, torch.float32, seed=11)
    fused, unfused = _run_both(rope_default_config(m, w.shape[0], K, 64), x, r, nw, w, b, pos, cs, slots,
                               shape, heads)
    if ON_CUDA or m == 1:
        assert all(_same_bits(a, c) for a, c in zip(fused, unfused))
    assert rel_err(fused[0], unfused[0]) < 1e-6 and _same_bits(fused[1], unfused[1])
    x, r, nw, w, b, pos, cs, slots, shape = _case(m, heads, DTYPE, seed=12)
    k_ref, v_ref = (c.cpu() for c in _caches(shape, DTYPE))
    q_ref, _ = ref.rms_norm_qkv_rope_reference(x.cpu(), r.cpu(), nw.cpu(), EPS, w.cpu(), b.cpu(), pos.cpu(),
                                               cs.cpu(), k_ref, v_ref, slots.cpu(), *heads)
    runs = []
    for _ in range(2):
        k, v = _caches(shape, DTYPE)
        runs.append((*rms_norm_qkv_rope_triton(x, r, nw, EPS, w, b, pos, cs, k, v, slots, *heads), k, v))
    rows = slots[slots >= 0].cpu()
    assert rel_err(runs[0][0], q_ref) < tolerance(DTYPE)
    assert rel_err(runs[0][2].cpu().flatten(0, 1)[rows], k_ref.flatten(0, 1)[rows]) < tolerance(DTYPE)
    assert all(_same_bits(a, c) for a, c in zip(*runs))


@pytest.mark.parametrize("m", tier([1, 5], [5]))
@triton_test
def test_fp8_cache_is_the_unfused_pair_bit_for_bit(m):
    """An FP8 cache: k and v quantized with their scales exactly as rotary_write_kv_triton stores
    them after the unfused GEMM (and as the reference, but for a few e4m3 roundings); q unchanged."""
    from kernels.skinny_tune import SkinnyConfig

    heads = (4, 2, 64)
    x, r, nw, w, b, pos, cs, slots, shape = _case(m, heads, DTYPE, [1] if m > 1 else [], seed=11)
    scales = [torch.tensor([s], device=DEVICE) for s in (0.02, 0.05)]
    fp8 = torch.float8_e4m3fn
    cfg = SkinnyConfig(16, 64, 4, 1, 1)
    k1, v1, k2, v2 = (torch.zeros(shape, device=DEVICE).to(fp8) for _ in range(4))
    from kernels.rotary_cache import rotary_write_kv_triton
    from kernels.skinny_gemm import rms_norm_linear_triton
    from kernels.skinny_rope import rms_norm_qkv_rope_triton

    q, _ = rms_norm_qkv_rope_triton(x, r, nw, EPS, w, b, pos, cs, k1, v1, slots, *heads, *scales, config=cfg)
    qkv, _ = rms_norm_linear_triton(x, r, nw, EPS, w, b, cfg)
    want_q = rotary_write_kv_triton(pos, qkv, cs, k2, v2, slots, *heads, k_scale=scales[0], v_scale=scales[1])
    assert _same_bits(q, want_q) and _same_bits(k1, k2) and _same_bits(v1, v2)
    k3, v3 = (torch.zeros(shape).to(fp8) for _ in range(2))
    ref.rms_norm_qkv_rope_reference(x.cpu(), r.cpu(), nw.cpu(), EPS, w.cpu(), b.cpu(), pos.cpu(), cs.cpu(), k3, v3,
                                    slots.cpu(), *heads, *(s.cpu() for s in scales))
    for got, want in ((k1.cpu(), k3), (v1.cpu(), v3)):  # a GEMM's last bit may move an e4m3 rounding
        mismatch = (got.view(torch.uint8) != want.view(torch.uint8)).float().mean().item()
        assert mismatch < 0.05  # (interpreted: the cast also truncates at binade edges, a few values)
        assert not ON_CUDA or rel_err(got.float(), want.float()) < 0.05


@triton_test
def test_out_of_scope_raises():
    from kernels.skinny_tune import SkinnyConfig
    from kernels.skinny_rope import rms_norm_qkv_rope_triton

    heads = (4, 2, 64)
    x, r, nw, w, b, pos, cs, slots, shape = _case(2, heads, DTYPE)
    k, v = _caches(shape, DTYPE)

    def call(*heads_, config=None, **swap):
        args = dict(x=x, residual=r, norm_weight=nw, eps=EPS, w=w, bias=b, positions=pos, cos_sin_cache=cs,
                    k_cache=k, v_cache=v, slot_mapping=slots)
        args.update(swap)
        return rms_norm_qkv_rope_triton(*args.values(), *(heads_ or heads), config=config)

    fp8 = torch.zeros(shape, device=DEVICE).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="FP8 .* needs k_scale"):  # an FP8 cache without its scales
        call(k_cache=fp8, v_cache=fp8)
    with pytest.raises(ValueError, match="v_cache dtype"):
        call(v_cache=fp8)
    with pytest.raises(ValueError, match="split_k"):
        call(config=SkinnyConfig(16, 64, 4, 1, 2))
    with pytest.raises(ValueError, match="block_n"):
        call(config=SkinnyConfig(128, 64, 4, 1, 1))  # wider than a head
    wrong = torch.zeros(shape[:2] + (4, 32), dtype=DTYPE, device=DEVICE)
    with pytest.raises(ValueError, match="cache heads"):
        call(k_cache=wrong, v_cache=wrong)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        call(4, 2, 48, w=w[:384], bias=b[:384])
    with pytest.raises(ValueError, match="w has 448 rows"):
        call(w=w[:-64], bias=b[:-64])
    with pytest.raises(ValueError, match="rows"):
        big = torch.zeros(17, K, dtype=DTYPE, device=DEVICE)
        call(x=big, residual=big, positions=pos.repeat(9)[:17], slot_mapping=slots.repeat(9)[:17])
    with pytest.raises(ValueError, match="positions"):
        call(positions=pos[:1])


@pytest.mark.cuda
@pytest.mark.skipif(not (ON_CUDA and torch.cuda.get_device_capability()[0] >= 9),
                    reason="needs CUDA, compute capability 9.0+")
def test_pdl_launch_gives_the_plain_bits():
    from kernels.skinny_rope import rms_norm_qkv_rope_triton

    for m in (1, 3):
        x, r, nw, w, b, pos, cs, slots, shape = _case(m, (32, 8, 64), DTYPE, seed=m)
        runs = []
        for pdl in (False, True):
            k, v = _caches(shape, DTYPE)
            runs.append((*rms_norm_qkv_rope_triton(x, r, nw, EPS, w, b, pos, cs, k, v, slots, 32, 8, 64, pdl=pdl),
                         k, v))
        for run in runs[1:]:
            assert all(_same_bits(a, c) for a, c in zip(runs[0], run)), m
