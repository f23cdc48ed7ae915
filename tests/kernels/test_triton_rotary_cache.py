"""The fused rotary + [q/k norm] + KV-write kernel against its reference (Triton; on CPU only
under TRITON_INTERPRET=1, as in test_triton_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from tests.kernels.kernel_cases import (
    DEVICE,
    DTYPES,
    ON_CUDA,
    POISON,
    TRITON_MARKS,
    rel_err,
    tier,
    tolerance,
)

pytestmark = TRITON_MARKS



def _rotary_write_kv_case(num_tokens, num_heads, num_kv_heads, head_dim, dtype, qk_norm, seed,
                          block_size=16, max_pos=4096):
    """Inputs on the CPU: positions, qkv, cos_sin_cache, slot_mapping (some negative), norm weights."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = num_tokens // block_size + 4
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[1::5] = -1
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    angles = torch.arange(max_pos).float()[:, None] / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    weights = [(torch.rand(head_dim, generator=gen) + 0.5).to(dtype) if qk_norm else None for _ in range(2)]
    return positions, qkv, cos_sin_cache, slots, (num_blocks, block_size, num_kv_heads, head_dim), weights


# (dtype index, head_dim, num_heads, num_kv_heads, qk_norm, is_neox)
ROTARY_WRITE_KV_CONFIGS = tier([(0, 64, 32, 8, False, True), (1, 64, 32, 8, True, True),
                                (0, 128, 16, 8, True, True), (1, 128, 12, 2, False, True),
                                (0, 64, 6, 6, False, False), (1, 128, 16, 4, True, False)],
                               [(1, 64, 32, 8, True, True), (0, 64, 6, 6, False, False)])  # the fast tier's


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads,qk_norm,is_neox", ROTARY_WRITE_KV_CONFIGS)
@pytest.mark.parametrize("num_tokens", [1, 7, 256] if ON_CUDA else [1, 7, 40])
def test_rotary_write_kv(dtype_index, head_dim, num_heads, num_kv_heads, qk_norm, is_neox, num_tokens):
    from kernels.rotary_cache import rotary_write_kv_triton

    dtype = DTYPES[dtype_index]
    positions, qkv, cos_sin_cache, slots, cache_shape, (q_w, k_w) = _rotary_write_kv_case(
        num_tokens, num_heads, num_kv_heads, head_dim, dtype, qk_norm, seed=num_tokens + head_dim)
    k_exp, v_exp = torch.full(cache_shape, POISON, dtype=dtype), torch.full(cache_shape, POISON, dtype=dtype)
    q_exp = ref.rotary_write_kv_reference(positions, qkv, cos_sin_cache, k_exp, v_exp, slots,
                                          num_heads, num_kv_heads, head_dim, is_neox, q_w, k_w, 1e-6)
    dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    qkv_dev = dev(qkv)
    k_dev, v_dev = dev(torch.full(cache_shape, POISON, dtype=dtype)), dev(torch.full(cache_shape, POISON, dtype=dtype))
    out = torch.full((num_tokens, num_heads, head_dim), POISON, dtype=dtype, device=DEVICE)
    q = rotary_write_kv_triton(dev(positions), qkv_dev, dev(cos_sin_cache), k_dev, v_dev,
                               dev(slots.to(torch.int32)), num_heads, num_kv_heads, head_dim, is_neox,
                               dev(q_w), dev(k_w), 1e-6, out=out)
    assert q is out
    assert not torch.isnan(q).any(), "unwritten q"
    assert rel_err(q, q_exp) < tolerance(dtype)
    assert torch.equal(qkv_dev.cpu(), qkv)  # input untouched
    written = slots[slots >= 0].long()
    k_flat, v_flat = k_dev.cpu().view(-1, num_kv_heads, head_dim), v_dev.cpu().view(-1, num_kv_heads, head_dim)
    assert not torch.isnan(k_flat[written]).any() and not torch.isnan(v_flat[written]).any()
    assert rel_err(k_flat[written], k_exp.view(-1, num_kv_heads, head_dim)[written]) < tolerance(dtype)
    assert torch.equal(v_flat[written], v_exp.view(-1, num_kv_heads, head_dim)[written])  # a plain copy
    untouched = torch.ones(k_flat.shape[0], dtype=torch.bool)
    untouched[written] = False
    assert torch.isnan(k_flat[untouched]).all() and torch.isnan(v_flat[untouched]).all()


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_rotary_write_kv_cuda_graph_replay():
    import kernels

    num_tokens, num_heads, num_kv_heads, head_dim, dtype = 8, 32, 8, 64, torch.bfloat16
    positions, qkv, cos_sin_cache, slots, cache_shape, _ = _rotary_write_kv_case(
        num_tokens, num_heads, num_kv_heads, head_dim, dtype, False, seed=1)
    positions, qkv, cos_sin_cache, slots = (t.to(DEVICE) for t in (positions, qkv, cos_sin_cache, slots))
    k_cache, v_cache = torch.zeros(cache_shape, dtype=dtype, device=DEVICE), torch.zeros(cache_shape, dtype=dtype, device=DEVICE)
    args = (positions, qkv, cos_sin_cache, k_cache, v_cache, slots, num_heads, num_kv_heads, head_dim)
    kernels.rotary_write_kv(*args)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = kernels.rotary_write_kv(*args)
    for seed in (2, 3):
        new_pos, new_qkv, _, new_slots, _, _ = _rotary_write_kv_case(
            num_tokens, num_heads, num_kv_heads, head_dim, dtype, False, seed=seed)
        positions.copy_(new_pos), qkv.copy_(new_qkv), slots.copy_(new_slots)
        k_cache.fill_(float("nan")), v_cache.fill_(float("nan")), q.fill_(float("nan"))
        graph.replay()
        k_exp, v_exp = torch.full_like(k_cache, float("nan")), torch.full_like(v_cache, float("nan"))
        q_exp = ref.rotary_write_kv_reference(positions, qkv, cos_sin_cache, k_exp, v_exp, slots,
                                              num_heads, num_kv_heads, head_dim)
        torch.cuda.synchronize()
        assert rel_err(q, q_exp) < 1e-2
        assert torch.equal(v_cache.isnan(), v_exp.isnan()) and torch.equal(v_cache.nan_to_num(), v_exp.nan_to_num())


def test_rotary_write_kv_rejects_bad_arguments():
    from kernels.rotary_cache import rotary_write_kv_triton

    positions, qkv, cos_sin_cache, slots, cache_shape, _ = _rotary_write_kv_case(3, 8, 2, 64, torch.float16, False, 0)
    positions, qkv, cos_sin_cache, slots = (t.to(DEVICE) for t in (positions, qkv, cos_sin_cache, slots))
    k_cache = torch.zeros(cache_shape, dtype=torch.float16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    with pytest.raises(ValueError, match="qkv row"):
        rotary_write_kv_triton(positions, qkv, cos_sin_cache, k_cache, v_cache, slots, 8, 4, 64)
    with pytest.raises(ValueError, match="k_cache"):
        rotary_write_kv_triton(positions, qkv, cos_sin_cache, k_cache.float(), v_cache, slots, 8, 2, 64)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_write_kv_triton(positions, qkv, cos_sin_cache, k_cache, v_cache, slots[:2], 8, 2, 64)
    with pytest.raises(ValueError, match="q_norm_weight"):
        rotary_write_kv_triton(positions, qkv, cos_sin_cache, k_cache, v_cache, slots, 8, 2, 64,
                               q_norm_weight=torch.ones(32, device=DEVICE))
