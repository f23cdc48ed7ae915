"""FP8 weights in the skinny decode kernels (kernels/fp8_weight.py; skinny_gemm.py, skinny_rope.py
read the e4m3 tiles and scale each column in the epilogue): the references dequantize (CPU,
always); the Triton kernels (CUDA, or interpreted with fp16) match them for every candidate config
and repeat bit for bit, the fused rope kernel equals its unfused pair bit for bit; an FP8 model's
skinny decode path equals its default path (CPU, forced through the references) and gives the
same greedy tokens on CUDA."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import fp8_reference
from kernels import reference as ref
from kernels.fp8_weight import Fp8Weight, float_weight
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, rel_err, tier, tolerance

FP8 = torch.float8_e4m3fn
EPS = 1e-5
DTYPE = torch.bfloat16 if ON_CUDA else torch.float16  # the interpreter's tl.dot mishandles bf16


def triton_test(fn):
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def _fp8(n, k, per_channel, seed=0, device=DEVICE) -> Fp8Weight:
    """e4m3 values over the whole range and positive float32 scales of a real layer (~0.02 weights)."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(n, k, generator=gen) * 120).clamp(-448, 448).to(FP8)
    scale = torch.rand(n if per_channel else 1, generator=gen) * 2e-4 + 1e-4
    return Fp8Weight(q.to(device), scale.to(device))


def _rand(*shape, dtype, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype).to(DEVICE)


# --- references: always run ----------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
def test_references_dequantize_as_the_w8a16_reference(per_channel):
    w = _fp8(48, 64, per_channel, device="cpu")
    x, b = torch.randn(5, 64), torch.randn(48)
    strategy = "channel" if per_channel else "tensor"
    assert torch.equal(float_weight(w), fp8_reference.dequantize_fp8_reference(w.q, w.scale, strategy, None))
    assert torch.equal(ref.skinny_linear_reference(x, w, b),
                       fp8_reference.w8a16_linear_reference(x, w.q, w.scale, strategy, None, b))
    assert torch.equal(kernels.skinny_linear(x, w, b), ref.skinny_linear_reference(x, w, b))
    gate_up = torch.randn(5, 128)
    assert torch.equal(kernels.silu_mul_linear(gate_up, w),
                       ref.skinny_linear_reference(ref.silu_and_mul_reference(gate_up), w))


# --- the Triton kernels ----------------------------------------------------------------------------

def _configs(m, k):
    from kernels.skinny_tune import CONFIGS, SkinnyConfig, fits

    if ON_CUDA:
        return [c for c in CONFIGS if fits(c, m, k)]
    cc = [SkinnyConfig(8, 64, 4, 1, 1, False)] if m > 1 else []  # 2+ rows on CUDA cores
    return [SkinnyConfig(32, 64, 4, 1, 1), SkinnyConfig(16, 64, 4, 1, 3)] + cc


@triton_test
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("m", tier([1, 3, 16], [1, 3]))
def test_skinny_kernels_take_fp8_weights(m, per_channel):
    """Every config (split-K, CUDA cores, tensor cores) and the tuned one: the plain, norm and SiLU
    kernels with an Fp8Weight match the dequantizing references and repeat bit for bit."""
    from kernels.skinny_gemm import rms_norm_linear_triton, silu_mul_linear_triton, skinny_linear_triton

    n, k = (3072, 2048) if ON_CUDA else (72, 200)
    x, r = _rand(m, k, dtype=DTYPE, seed=1), _rand(m, k, dtype=DTYPE, seed=2)
    nw, b = _rand(k, dtype=DTYPE, seed=3, scale=0.2).add_(1.0), _rand(n, dtype=DTYPE, seed=4)
    gate_up = _rand(m, 2 * k, dtype=DTYPE, seed=5)
    w, w_down = _fp8(n, k, per_channel, seed=6), _fp8(n, k, per_channel, seed=7)
    expected = (ref.skinny_linear_reference(x, w, b), *ref.rms_norm_linear_reference(x, r, nw, EPS, w, b),
                ref.silu_mul_linear_reference(gate_up, w_down))
    for cfg in _configs(m, k) + [None]:
        runs = [(skinny_linear_triton(x, w, b, config=cfg), *rms_norm_linear_triton(x, r, nw, EPS, w, b, cfg),
                 silu_mul_linear_triton(gate_up, w_down, cfg)) for _ in range(2)]
        for got, want in zip(runs[0], expected):
            assert got.dtype == DTYPE and rel_err(got, want) < tolerance(DTYPE), cfg
        assert all(torch.equal(a, c) for a, c in zip(*runs)), f"not deterministic: {cfg}"


@triton_test
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("m", tier([1, 5], [1]))
def test_fused_rope_with_fp8_weights_is_the_unfused_pair(m, per_channel):
    from kernels.rotary_cache import rotary_write_kv_triton
    from kernels.skinny_gemm import rms_norm_linear_triton
    from kernels.skinny_rope import rms_norm_qkv_rope_triton
    from kernels.skinny_tune import SkinnyConfig

    hq, hk, d, k, block = 4, 2, 32, 96, 8
    x, r = _rand(m, k, dtype=DTYPE, seed=1), _rand(m, k, dtype=DTYPE, seed=2)
    nw = _rand(k, dtype=DTYPE, seed=3, scale=0.2).add_(1.0)
    w = _fp8((hq + 2 * hk) * d, k, per_channel, seed=4)
    pos = torch.arange(m, device=DEVICE) + 3
    angles = torch.arange(64).float()[:, None] / (10000 ** (torch.arange(0, d, 2).float() / d))
    cs = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    slots = torch.arange(m, device=DEVICE) * 2
    shape = (m // 4 + 2, block, hk, d)
    for cfg in (SkinnyConfig(16, 64, 4, 1, 1), None):
        k1, v1, k2, v2 = (torch.zeros(shape, dtype=DTYPE, device=DEVICE) for _ in range(4))
        q, new_r = rms_norm_qkv_rope_triton(x, r, nw, EPS, w, None, pos, cs, k1, v1, slots, hq, hk, d, config=cfg)
        qkv, want_r = rms_norm_linear_triton(x, r, nw, EPS, w, None, cfg or SkinnyConfig(16, 64, 4, 1, 1))
        want_q = rotary_write_kv_triton(pos, qkv, cs, k2, v2, slots, hq, hk, d)
        if cfg is not None:  # the same config: the same bits
            assert torch.equal(q, want_q) and torch.equal(k1, k2) and torch.equal(v1, v2)
        q_ref = ref.rms_norm_qkv_rope_reference(x, r, nw, EPS, w, None, pos, cs, k2, v2, slots, hq, hk, d)[0]
        assert rel_err(q, q_ref) < tolerance(DTYPE) and torch.equal(new_r, want_r)


@triton_test
def test_bad_fp8_weights_raise():
    from kernels.skinny_gemm import skinny_linear_triton

    x, w = _rand(2, 64, dtype=DTYPE, seed=1), _fp8(40, 64, True)
    with pytest.raises(ValueError, match="w.scale"):
        skinny_linear_triton(x, Fp8Weight(w.q, w.scale[:3]))
    with pytest.raises(ValueError, match="w.scale"):
        skinny_linear_triton(x, Fp8Weight(w.q, w.scale.double()))
    with pytest.raises(ValueError, match="w.q"):
        skinny_linear_triton(x, Fp8Weight(w.q.to(DTYPE), w.scale))


# --- the FP8 model's skinny decode path ------------------------------------------------------------

@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8])
def test_fp8_model_skinny_path_matches_its_default_path_on_cpu(tmp_path, monkeypatch, kv_dtype):
    """--quantization fp8 (per-channel scales): the skinny layers read Fp8Weights, forced on with
    the references on CPU == the Fp8Linear path, an FP8 KV cache written by the fused norm + qkv +
    rope kernel (one a layer) as by the unfused pair."""
    from executor_svc.model_loader.random_model import build_random_model
    from executor_svc.model_loader.safetensors import load_model
    from executor_svc.models import layers
    from executor_svc.startup.kv_cache import allocate_kv_caches
    from tests.executor.models.test_model import _prefill_meta

    model = load_model(build_random_model(tmp_path / "m", "tiny-llama"), "cpu", torch.float32,
                       quantization="fp8", skinny_max_tokens=16)
    assert model.skinny_max_tokens == 16
    assert isinstance(layers.skinny_weight(model.layers[0].mlp.down_proj), Fp8Weight)
    ids = torch.randint(0, model.args.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    outs, reads = [], []
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(layers, "use_skinny", lambda x, max_tokens: 0 < x.shape[0] <= max_tokens)
            fused, rope, ropes = layers.skinny_linear, layers.rms_norm_qkv_rope, []
            monkeypatch.setattr(layers, "skinny_linear", lambda x, w, *a, **kw: reads.append(w) or fused(x, w, *a, **kw))
            monkeypatch.setattr(layers, "rms_norm_qkv_rope", lambda *a, **kw: ropes.append(a[4]) or rope(*a, **kw))
        caches = allocate_kv_caches(model.args, 4, 16, kv_dtype, torch.device("cpu"))
        with torch.inference_mode():
            hidden = model(ids, torch.arange(12), _prefill_meta(12, [2], 16), caches)
            outs.append((model.compute_logits(hidden), caches[0].k.float()))
    monkeypatch.undo()
    assert len(ropes) == model.args.num_layers and all(isinstance(w, Fp8Weight) for w in ropes)
    # o_proj of each layer reads its Fp8Weight (compute_logits the dense lm_head)
    assert sum(isinstance(w, Fp8Weight) for w in reads) == model.args.num_layers
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[1][1], outs[0][1])  # layer 0's cache, written the same


@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_fp8_model_greedy_tokens_equal_with_skinny_on_and_off(tmp_path, kv_cache_dtype):
    """bf16 tiny Llama, --quantization fp8 (and an FP8 KV cache): eager decode tokens with the FP8
    skinny path off == on (batches 1 and 5), and graphs captured with it on replay the eager tokens."""
    from executor_svc.model_loader.random_model import build_random_model
    from tests.executor.cuda_helpers import Driver, check_graph_tokens_equal_eager, cuda_runner

    runner = cuda_runner(build_random_model(tmp_path / "m", "tiny-llama"), quantization="fp8",
                         kv_cache_dtype=kv_cache_dtype,
                         max_num_seqs=8, cuda_graph_sizes=(1, 2, 4, 8), num_kv_blocks=8 * 16 + 1)
    model = runner.model
    assert model.skinny_max_tokens > 0
    runner.use_graphs(False)
    try:
        for num_reqs in (1, 5):
            tokens = {}
            for max_tokens in (0, kernels.SKINNY_MAX_M):
                model.skinny_max_tokens = max_tokens
                driver = Driver(runner, num_reqs)
                driver.decode(6)
                tokens[max_tokens] = driver.tokens
            assert tokens[0] == tokens[kernels.SKINNY_MAX_M], num_reqs
    finally:
        runner.use_graphs(True)
    for num_reqs in (1, 5):
        check_graph_tokens_equal_eager(runner, num_reqs)
