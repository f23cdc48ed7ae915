"""Each Triton kernel against its reference. Runs on CUDA; on CPU only under TRITON_INTERPRET=1
(the Triton interpreter, small shapes, no bf16: the interpreter's tl.dot mishandles bf16)."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import reference as ref
from tests.kernels.kernel_cases import (
    DEVICE,
    DTYPES,
    ON_CUDA,
    POISON,
    TRITON_MARKS,
    dense_attention,
    make_case,
    mixed_lens,
    rel_err,
    tier,
    tolerance,
)

pytestmark = TRITON_MARKS



def _decode(case, num_splits=None, out=None):
    from kernels.attention_decode import paged_decode_attention_triton

    return paged_decode_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables,
                                         case.seq_lens, case.scale, num_splits=num_splits, out=out)


def _decode_lens(rng, batch, max_ctx):
    lens = [rng.randint(1, max_ctx) for _ in range(batch)]
    if batch > 2:
        lens[rng.randrange(batch)] = 0  # a padded row
    return lens


# (dtype index, head_dim, num_heads, num_kv_heads): a spread rather than the full product, to
# keep the number of compiled variants (and the GPU run) small.
ATTENTION_CONFIGS = [(0, 64, 32, 8), (1, 64, 32, 8), (0, 128, 16, 8), (1, 128, 16, 16),
                     (0, 64, 14, 2), (1, 128, 12, 2), (0, 128, 8, 8)]
# the fast tier's: both dtypes and head dims, groups of 4 and 6 query heads per KV head
FAST_ATTENTION = tier(ATTENTION_CONFIGS, [(0, 64, 32, 8), (1, 128, 12, 2)])


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads", FAST_ATTENTION)
@pytest.mark.parametrize("batch", [1, 7, 64] if ON_CUDA else [1, 5])
def test_decode_attention(dtype_index, head_dim, num_heads, num_kv_heads, batch):
    dtype = DTYPES[dtype_index]
    rng = random.Random(batch * 1000 + head_dim + num_heads)
    max_ctx = 4000 if ON_CUDA else 150
    seq_lens = _decode_lens(rng, batch, max_ctx)
    case = make_case([1] * batch, seq_lens, num_heads, num_kv_heads, head_dim, 16, dtype, DEVICE, seed=batch)
    expected = dense_attention(case)
    for num_splits in (None, 1, 5):
        out = torch.full_like(case.q, POISON)
        _decode(case, num_splits, out)
        assert not torch.isnan(out).any(), f"unwritten or NaN output (num_splits={num_splits})"
        assert rel_err(out, expected) < tolerance(dtype), f"num_splits={num_splits}"
        for i, s in enumerate(seq_lens):
            if s == 0:
                assert torch.all(out[i] == 0)


@pytest.mark.parametrize("block_size", [8, 32])
def test_decode_attention_block_sizes(block_size):
    case = make_case([1, 1, 1], [1, 77, 130], 8, 2, 64, block_size, torch.float16, DEVICE, seed=block_size)
    assert rel_err(_decode(case), dense_attention(case)) < 1e-2


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads", FAST_ATTENTION)
def test_paged_attention_varlen(dtype_index, head_dim, num_heads, num_kv_heads):
    dtype = DTYPES[dtype_index]
    from kernels.attention_prefill import paged_attention_triton

    rng = random.Random(head_dim + num_heads)
    q_lens, seq_lens = [], []
    num_seqs = 12 if ON_CUDA else 4
    max_ctx = 3000 if ON_CUDA else 140
    for _ in range(num_seqs):
        kind = rng.choice(["prefill", "chunk", "decode", "padded"])
        seq_len = rng.randint(1, max_ctx)
        if kind == "padded":
            q_lens.append(1)
            seq_lens.append(0)
            continue
        q_len = {"prefill": min(seq_len, 700), "chunk": rng.randint(1, min(seq_len, 300)), "decode": 1}[kind]
        q_lens.append(q_len)
        seq_lens.append(max(seq_len, q_len))
    case = make_case(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, 16, dtype, DEVICE, seed=head_dim)
    out = torch.full_like(case.q, POISON)
    paged_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                           case.query_start_loc, case.scale, case.max_query_len, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, dense_attention(case)) < tolerance(dtype)


WINDOW_CONFIGS = tier([(0, 64, 32, 8, 16), (1, 128, 12, 2, 8), (0, 128, 8, 8, 32)],  # ..., block_size
                      [(0, 64, 32, 8, 16), (1, 128, 12, 2, 8)])
WINDOWS = tier([1, 37, 256], [37, 256])


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads,block_size", WINDOW_CONFIGS)
@pytest.mark.parametrize("window", WINDOWS)
def test_decode_attention_sliding_window(dtype_index, head_dim, num_heads, num_kv_heads, block_size, window):
    """Blocks wholly before the window are NaN in the case: a read of one shows in the output."""
    dtype = DTYPES[dtype_index]
    rng = random.Random(window + head_dim)
    batch = 9 if ON_CUDA else 3
    seq_lens = _decode_lens(rng, batch, 3000 if ON_CUDA else 150)
    case = make_case([1] * batch, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, DEVICE,
                     seed=window, sliding_window=window)
    expected = dense_attention(case, window)
    for num_splits in (None, 1, 5):
        out = torch.full_like(case.q, POISON)
        from kernels.attention_decode import paged_decode_attention_triton

        paged_decode_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                      case.scale, num_splits=num_splits, out=out, sliding_window=window)
        assert not torch.isnan(out).any(), f"NaN: a block before the window was read (num_splits={num_splits})"
        assert rel_err(out, expected) < tolerance(dtype), f"num_splits={num_splits}"


@pytest.mark.parametrize("dtype_index,head_dim,num_heads,num_kv_heads,block_size", WINDOW_CONFIGS)
@pytest.mark.parametrize("window", WINDOWS)
def test_paged_attention_varlen_sliding_window(dtype_index, head_dim, num_heads, num_kv_heads, block_size, window):
    from kernels.attention_prefill import paged_attention_triton

    dtype = DTYPES[dtype_index]
    rng = random.Random(window * 7 + head_dim)
    max_ctx = 2000 if ON_CUDA else 140
    q_lens, seq_lens = mixed_lens(rng, ["prefill", "chunk", "decode", "padded", "chunk", "prefill", "decode"], max_ctx)
    case = make_case(q_lens, seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, DEVICE,
                     seed=window, sliding_window=window)
    out = torch.full_like(case.q, POISON)
    paged_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                           case.query_start_loc, case.scale, case.max_query_len, out=out, sliding_window=window)
    assert not torch.isnan(out).any(), "NaN: a block before the window was read"
    assert rel_err(out, dense_attention(case, window)) < tolerance(dtype)


def test_paged_attention_dispatch_pure_prefill_and_decode():
    import kernels

    for q_lens, seq_lens in [([50, 3], [50, 3]), ([1, 1, 1], [40, 0, 9])]:
        case = make_case(q_lens, seq_lens, 8, 2, 64, 16, torch.float16, DEVICE, seed=len(q_lens))
        if ON_CUDA:
            out = kernels.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                          case.query_start_loc, case.scale, case.max_query_len, case.max_seq_len)
        else:
            from kernels.attention_prefill import paged_attention_triton
            out = paged_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                         case.query_start_loc, case.scale, case.max_query_len)
        assert rel_err(out, dense_attention(case)) < 1e-2


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("window", [None, 100])
def test_decode_attention_cuda_graph_replay(window):
    import kernels

    batch, num_heads, num_kv_heads, head_dim = 8, 32, 8, 64
    first = make_case([1] * batch, [400] * batch, num_heads, num_kv_heads, head_dim, 16, torch.bfloat16, DEVICE, seed=1)
    # Static buffers sized once; new data is copied into them before each replay.
    q, k_cache, v_cache = first.q.clone(), first.k_cache.clone(), first.v_cache.clone()
    block_tables, seq_lens = torch.zeros_like(first.block_tables), first.seq_lens.clone()
    block_tables.copy_(first.block_tables)
    kernels.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, first.scale, window)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, first.scale, window)
    for seed, lens in [(2, [5, 0, 290, 17, 1, 64, 0, 333]), (3, [1, 2, 3, 4, 300, 200, 100, 16])]:
        case = make_case([1] * batch, lens, num_heads, num_kv_heads, head_dim, 16, torch.bfloat16, DEVICE, seed=seed,
                         sliding_window=window or 0)
        assert case.k_cache.shape[0] <= k_cache.shape[0] and case.block_tables.shape[1] <= block_tables.shape[1]
        k_cache.fill_(float("nan")), v_cache.fill_(float("nan")), block_tables.zero_()
        k_cache[: case.k_cache.shape[0]].copy_(case.k_cache)
        v_cache[: case.v_cache.shape[0]].copy_(case.v_cache)
        block_tables[:, : case.block_tables.shape[1]].copy_(case.block_tables)
        q.copy_(case.q), seq_lens.copy_(case.seq_lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, dense_attention(case, window or 0)) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_kv_heads,head_dim", [(8, 64), (2, 128), (3, 64)])
def test_write_kv(dtype, num_kv_heads, head_dim):
    from kernels.cache import write_kv_triton

    num_blocks, block_size, num_tokens = 20, 16, 50
    gen = torch.Generator().manual_seed(head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::7] = -1
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.full(shape, -777.0, dtype=dtype) for _ in range(4)]
    ref.write_kv_reference(key, value, caches[0], caches[1], slots)
    k_dev, v_dev = caches[2].to(DEVICE), caches[3].to(DEVICE)
    write_kv_triton(key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slots.to(torch.int32).to(DEVICE))
    assert torch.equal(k_dev.cpu(), caches[0]) and torch.equal(v_dev.cpu(), caches[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [2048, 1000])
def test_rms_norm(dtype, hidden):
    from kernels.norm import rms_norm_triton

    x, r = torch.randn(9, hidden).to(dtype), torch.randn(9, hidden).to(dtype)
    w = torch.rand(hidden) + 0.5
    out = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), 1e-5)
    assert rel_err(out, ref.rms_norm_reference(x, w, 1e-5)) < 1e-2
    out, new_residual = rms_norm_triton(x.to(DEVICE), w.to(DEVICE), 1e-5, r.to(DEVICE))
    out_ref, new_residual_ref = ref.rms_norm_reference(x, w, 1e-5, r)
    assert torch.equal(new_residual.cpu(), new_residual_ref)
    assert rel_err(out, out_ref) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    from kernels.activation import silu_and_mul_triton

    x = torch.randn(6, 2 * 1500).to(dtype)
    assert rel_err(silu_and_mul_triton(x.to(DEVICE)), ref.silu_and_mul_reference(x)) < 1e-2


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding(is_neox, dtype):
    from kernels.rotary import rotary_embedding_triton

    dim, max_pos, num_tokens = 64, 512, 11
    angles = torch.arange(max_pos).float()[:, None] / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
    positions = torch.randint(0, max_pos, (num_tokens,))
    qkv = torch.randn(num_tokens, (12 + 2 * 4) * dim).to(dtype)  # q, k as strided views of a fused qkv
    q, k = qkv[:, : 12 * dim].view(num_tokens, 12, dim), qkv[:, 12 * dim: 16 * dim].view(num_tokens, 4, dim)
    q_ref, k_ref = ref.rotary_embedding_reference(positions, q.clone(), k.clone(), cos_sin_cache, is_neox)
    qkv_dev = qkv.to(DEVICE)
    q_dev = qkv_dev[:, : 12 * dim].view(num_tokens, 12, dim)
    k_dev = qkv_dev[:, 12 * dim: 16 * dim].view(num_tokens, 4, dim)
    rotary_embedding_triton(positions.to(DEVICE), q_dev, k_dev, cos_sin_cache.to(DEVICE), is_neox)
    assert rel_err(q_dev, q_ref) < 1e-2 and rel_err(k_dev, k_ref) < 1e-2
    assert torch.equal(qkv_dev[:, 16 * dim:].cpu(), qkv[:, 16 * dim:])  # v untouched


def test_wrappers_reject_bad_arguments():
    from kernels.attention_decode import paged_decode_attention_triton

    case = make_case([1, 1], [10, 20], 8, 2, 64, 16, torch.float16, DEVICE)
    with pytest.raises(ValueError, match="block_tables"):
        paged_decode_attention_triton(case.q, case.k_cache, case.v_cache, case.block_tables.long(),
                                      case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="k_cache"):
        paged_decode_attention_triton(case.q, case.k_cache.float(), case.v_cache, case.block_tables,
                                      case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="contiguous"):
        paged_decode_attention_triton(case.q.transpose(1, 2), case.k_cache, case.v_cache, case.block_tables,
                                      case.seq_lens, case.scale)
