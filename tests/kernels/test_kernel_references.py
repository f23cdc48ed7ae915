"""The plain-torch references (the specification) against independent torch formulations. CPU only."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import dense_attention, gumbel_case, make_case, rel_err


def _run_reference(case):
    return ref.paged_attention_reference(case.q, case.k_cache, case.v_cache, case.block_tables,
                                         case.seq_lens, case.query_start_loc, case.scale)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_attention_reference_matches_dense(num_heads, num_kv_heads, block_size, seed):
    rng = random.Random(seed)
    # A mix: full prefill, chunked prefill over a cached prefix, decode rows, an empty request.
    q_lens, seq_lens = [], []
    for _ in range(6):
        kind = rng.choice(["prefill", "chunk", "decode", "empty"])
        seq_len = rng.randint(1, 90)
        q_len = {"prefill": seq_len, "chunk": rng.randint(1, seq_len), "decode": 1, "empty": 0}[kind]
        q_lens.append(q_len)
        seq_lens.append(seq_len)
    case = make_case(q_lens, seq_lens, num_heads, num_kv_heads, 32, block_size, torch.float32, "cpu", seed)
    out = _run_reference(case)
    assert not torch.isnan(out).any()
    assert rel_err(out, dense_attention(case)) < 1e-5


@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("block_size", [8, 16])
def test_windowed_reference_matches_dense_and_skips_blocks_before_the_window(window, block_size):
    """Query q sees keys q - window < k <= q; blocks wholly before the first new token's window
    hold NaN in the case, so any read of them shows."""
    rng = random.Random(window * 100 + block_size)
    q_lens, seq_lens = [], []
    for kind in ["prefill", "chunk", "decode", "decode", "chunk", "empty", "prefill"]:
        seq_len = rng.randint(1, 120)
        q_lens.append({"prefill": seq_len, "chunk": rng.randint(1, seq_len), "decode": 1, "empty": 0}[kind])
        seq_lens.append(seq_len)
    case = make_case(q_lens, seq_lens, 8, 2, 32, block_size, torch.float32, "cpu", window, sliding_window=window)
    assert torch.isnan(case.k_cache[1:]).any(), "no block fell out of the window"
    out = ref.paged_attention_reference(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                        case.query_start_loc, case.scale, window)
    assert not torch.isnan(out).any()
    expected = dense_attention(case, window)
    assert rel_err(out, expected) < 1e-5
    decode = make_case([1] * 4, [70, 3, 0, 41], 4, 4, 16, block_size, torch.float32, "cpu", 7, sliding_window=window)
    out = kernels.paged_decode_attention(decode.q, decode.k_cache, decode.v_cache, decode.block_tables,
                                         decode.seq_lens, decode.scale, window)
    assert rel_err(out, dense_attention(decode, window)) < 1e-5 and torch.all(out[2] == 0)


def test_window_changes_the_output_and_none_or_zero_is_full():
    case = make_case([30, 1], [30, 50], 4, 2, 16, 8, torch.float32, "cpu", seed=9)
    full = _run_reference(case)
    for no_window in (None, 0, 50):  # 50: a window as long as the context
        args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.query_start_loc)
        assert torch.equal(ref.paged_attention_reference(*args, case.scale, no_window), full)
    windowed = ref.paged_attention_reference(case.q, case.k_cache, case.v_cache, case.block_tables,
                                             case.seq_lens, case.query_start_loc, case.scale, 8)
    assert torch.equal(windowed[:8], full[:8])  # the first 8 positions see everything anyway
    assert rel_err(windowed[8:], full[8:]) > 1e-2


def test_paged_attention_reference_bf16():
    case = make_case([7, 1, 30], [20, 55, 30], 8, 2, 64, 16, torch.bfloat16, "cpu", seed=3)
    out = _run_reference(case)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, dense_attention(case)) < 1e-2


def test_decode_reference_padded_rows_are_zero():
    case = make_case([1, 1, 1, 1], [33, 0, 5, 0], 8, 2, 32, 16, torch.float32, "cpu", seed=4)
    out = ref.paged_decode_attention_reference(case.q, case.k_cache, case.v_cache, case.block_tables,
                                               case.seq_lens, case.scale)
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0)
    assert rel_err(out, dense_attention(case)) < 1e-5


def test_dispatch_on_cpu_uses_reference():
    case = make_case([3, 1], [9, 17], 4, 2, 16, 8, torch.float32, "cpu", seed=5)
    out = kernels.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens,
                                  case.query_start_loc, case.scale, case.max_query_len, case.max_seq_len)
    assert torch.equal(out, _run_reference(case))
    dec = make_case([1, 1], [9, 17], 4, 2, 16, 8, torch.float32, "cpu", seed=5)
    out = kernels.paged_decode_attention(dec.q, dec.k_cache, dec.v_cache, dec.block_tables, dec.seq_lens,
                                         dec.scale)
    assert rel_err(out, dense_attention(dec)) < 1e-5


def test_import_kernels_does_not_import_triton():
    code = "import sys, kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_write_kv_reference_skips_negative_slots():
    num_blocks, block_size, heads, dim = 6, 4, 2, 8
    poison = -777.0
    k_cache = torch.full((num_blocks, block_size, heads, dim), poison)
    v_cache = torch.full_like(k_cache, poison)
    slot_mapping = torch.tensor([5, -1, 20, 0, -3, 13])
    key, value = torch.randn(6, heads, dim), torch.randn(6, heads, dim)
    kernels.write_kv(key, value, k_cache, v_cache, slot_mapping)
    k_flat, v_flat = k_cache.view(-1, heads, dim), v_cache.view(-1, heads, dim)
    written = set()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            written.add(slot)
            block, offset = divmod(slot, block_size)
            assert torch.equal(k_cache[block, offset], key[t]) and torch.equal(v_flat[slot], value[t])
    untouched = [s for s in range(num_blocks * block_size) if s not in written]
    assert torch.all(k_flat[untouched] == poison) and torch.all(v_flat[untouched] == poison)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_reference(dtype):
    x, r = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype)
    w, eps = torch.rand(64) + 0.5, 1e-6
    norm = torch.nn.RMSNorm(64, eps=eps)
    norm.weight.data.copy_(w)
    expected = norm(x.float()).to(dtype)
    assert rel_err(kernels.rms_norm(x, w, eps), expected) < 1e-5
    out, new_residual = kernels.rms_norm(x, w, eps, residual=r)
    h = x + r
    assert torch.equal(new_residual, h)
    assert rel_err(out, norm(h.float()).to(dtype)) < 1e-5
    assert out.dtype == dtype and new_residual.dtype == dtype


def test_silu_and_mul_reference():
    x = torch.randn(7, 2 * 48)
    gate, up = x.chunk(2, dim=-1)
    expected = gate / (1 + torch.exp(-gate)) * up
    assert torch.allclose(kernels.silu_and_mul(x), expected, atol=1e-6)


def _rope_complex(x, positions, inv_freq, is_neox):
    """Rotary as complex multiplication by e^(i pos f); x [T, H, D] float32."""
    half = x.shape[-1] // 2
    if is_neox:
        z = torch.complex(x[..., :half], x[..., half:])
    else:
        z = torch.complex(x[..., 0::2], x[..., 1::2])
    z = z * torch.polar(torch.ones(1), positions[:, None, None].float() * inv_freq)
    if is_neox:
        return torch.cat([z.real, z.imag], dim=-1)
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding_reference(is_neox):
    dim, max_pos = 32, 100
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(max_pos).float()[:, None] * inv_freq
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)  # [max_pos, dim]
    positions = torch.tensor([0, 5, 99, 42])
    q, k = torch.randn(4, 6, dim), torch.randn(4, 2, dim)
    q_expected, k_expected = _rope_complex(q, positions, inv_freq, is_neox), _rope_complex(k, positions, inv_freq, is_neox)
    q_out, k_out = kernels.rotary_embedding(positions, q, k, cos_sin_cache, is_neox)
    assert q_out is q and k_out is k  # in place
    assert torch.allclose(q, q_expected, atol=1e-5) and torch.allclose(k, k_expected, atol=1e-5)


def _rope_cache(dim, max_pos):
    angles = torch.arange(max_pos).float()[:, None] / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    return torch.cat([angles.cos(), angles.sin()], dim=-1)  # [max_pos, dim]


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotary_write_kv_reference_matches_unfused(qk_norm, is_neox, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_kv_heads = rng.choice([1, 2, 4])
    num_heads = num_kv_heads * rng.choice([1, 2, 3, 4])  # GQA ratios 1..4
    head_dim, block_size, num_blocks = rng.choice([16, 32, 64]), rng.choice([4, 8]), 9
    num_tokens, max_pos, eps = rng.randint(1, 20), 300, 1e-6
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slot_mapping[torch.rand(num_tokens, generator=gen) < 0.3] = -1
    slot_mapping[0] = -1  # always at least one skipped token
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(dtype)
    qkv_before = qkv.clone()
    cos_sin_cache = _rope_cache(head_dim, max_pos)
    q_w = (torch.rand(head_dim, generator=gen) + 0.5).to(dtype) if qk_norm else None
    k_w = (torch.rand(head_dim, generator=gen) + 0.5).to(dtype) if qk_norm else None
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    poison = -777.0
    k_cache, v_cache = torch.full(shape, poison, dtype=dtype), torch.full(shape, poison, dtype=dtype)
    k_exp, v_exp = k_cache.clone(), v_cache.clone()

    # The unfused sequence, as the model ran it before the fusion.
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.clone().split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(num_tokens, num_heads, head_dim)
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim).contiguous()
    if qk_norm:
        q = ref.rms_norm_reference(q.reshape(-1, head_dim), q_w, eps).view_as(q)
        k = ref.rms_norm_reference(k.reshape(-1, head_dim), k_w, eps).view_as(k)
    q, k = ref.rotary_embedding_reference(positions, q.contiguous(), k.contiguous(), cos_sin_cache, is_neox)
    ref.write_kv_reference(k, v, k_exp, v_exp, slot_mapping)

    q_out = kernels.rotary_write_kv(positions, qkv, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                    num_heads, num_kv_heads, head_dim, is_neox, q_w, k_w, eps)
    assert q_out.shape == (num_tokens, num_heads, head_dim) and q_out.is_contiguous()
    assert q_out.dtype == dtype
    assert torch.equal(q_out, q)
    assert torch.equal(k_cache, k_exp) and torch.equal(v_cache, v_exp)
    assert torch.equal(qkv, qkv_before)  # input untouched
    # Negative slots wrote nothing: every slot not in slot_mapping still holds the poison.
    written = set(s for s in slot_mapping.tolist() if s >= 0)
    untouched = [s for s in range(num_blocks * block_size) if s not in written]
    assert torch.all(k_cache.view(-1, num_kv_heads, head_dim)[untouched] == poison)
    assert torch.all(v_cache.view(-1, num_kv_heads, head_dim)[untouched] == poison)


def _mix32_int(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_uniform_noise_matches_the_hash_in_python_ints():
    seeds, positions = [0, 7, (1 << 62) + 12345, (1 << 63) - 1], [0, 3, 4095, 1 << 33]
    u = ref.uniform_noise(torch.tensor(seeds), torch.tensor(positions), 3000)
    for r, (seed, pos) in enumerate(zip(seeds, positions)):
        key = _mix32_int(_mix32_int(_mix32_int((seed & 0xFFFFFFFF) ^ 0x9E3779B9) ^ (seed >> 32)) ^ (pos & 0xFFFFFFFF))
        for j in (0, 1, 2, 1000, 2999):
            bits = _mix32_int((_mix32_int(key ^ j) + j) & 0xFFFFFFFF)
            assert u[r, j].item() == ((bits >> 9) + 0.5) / 2**23


def _previous_torch_sampler(logits, temperature, seeds, positions):
    """executor_svc/sample/sampler.sample() before kernels.gumbel_sample (no top-k/top-p), verbatim."""
    greedy = logits.argmax(dim=-1)
    scaled = logits / temperature.clamp_min(1e-5)[:, None]
    u = ref.uniform_noise(seeds, positions, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, sampled, greedy)


@pytest.mark.parametrize("n,vocab", [(1, 1000), (7, 50), (64, 3000), (256, 500)])
def test_gumbel_sample_reference_matches_previous_sampler(n, vocab):
    logits, temperature, seeds, positions = gumbel_case(n, vocab, seed=n)
    out = ref.gumbel_sample_reference(logits, temperature, seeds, positions)
    assert out.dtype == torch.int64 and out.shape == (n,)
    assert torch.equal(out, _previous_torch_sampler(logits, temperature, seeds, positions))
    assert torch.isfinite(logits.gather(1, out[:, None])).squeeze(1)[logits.isfinite().any(-1)].all()
    greedy = temperature == 0
    assert torch.equal(out[greedy], logits.argmax(-1)[greedy])
    if n > 4:
        assert out[4] == 0
    if n > 1 and temperature[1] == 0:
        assert out[1] == vocab // 3
    assert torch.equal(kernels.gumbel_sample(logits, temperature, seeds, positions), out)  # CPU dispatch


def test_gumbel_sample_reference_bf16_is_float32_math():
    logits, temperature, seeds, positions = gumbel_case(16, 700, seed=3)
    low = logits.to(torch.bfloat16)
    out = ref.gumbel_sample_reference(low, temperature, seeds, positions)
    assert torch.equal(out, _previous_torch_sampler(low.float(), temperature, seeds, positions))


@pytest.mark.parametrize("n,vocab", [(1, 1000), (9, 50), (64, 3001)])
def test_gumbel_sample_reference_samples_only_what_a_bitmask_allows(n, vocab):
    from tests.kernels.kernel_cases import bitmask_case

    logits, temperature, seeds, positions = gumbel_case(n, vocab, seed=n + 1)
    allowed, dense = bitmask_case(n, vocab, seed=n)
    assert torch.equal(ref.bitmask_allows(allowed, vocab), dense)  # bit j % 32 of word j // 32
    out = ref.gumbel_sample_reference(logits, temperature, seeds, positions, allowed)
    masked = logits.masked_fill(~dense, float("-inf"))
    assert torch.equal(out, ref.gumbel_sample_reference(masked, temperature, seeds, positions))
    possible = torch.isfinite(masked).any(-1)
    assert dense.gather(1, out[:, None]).squeeze(1)[possible].all()
    assert torch.equal(kernels.gumbel_sample(logits, temperature, seeds, positions, allowed), out)
