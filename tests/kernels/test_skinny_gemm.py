"""Skinny GEMMs (kernels/skinny_gemm.py): references vs the unfused references (CPU, always), the
Triton kernels vs the references (CUDA, or CPU under TRITON_INTERPRET=1 with fp16/fp32 and small
shapes: the numpy interpreter mishandles bf16), and the model's decode path with them on/off."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, rel_err, tier, tolerance

DTYPES = [torch.bfloat16, torch.float32] if ON_CUDA else [torch.float16, torch.float32]
ROWS = [1, 3, 8, 16]
# (N, K): non-multiples of the block sizes; the llama-1b qkv shape on the GPU only (too slow interpreted)
SHAPES = [(1000, 576), (72, 200)] + ([(3072, 2048)] if ON_CUDA else [])
EPS = 1e-5
# the fast tier's sweeps: bf16, partial N and K tiles, one row and a partial row tile (every
# config, split-K and the tuned choice at the llama-1b shape: test_every_config_and_determinism)
FAST_DTYPES, FAST_SHAPES, FAST_ROWS = tier(DTYPES, [torch.bfloat16]), tier(SHAPES, [(1000, 576)]), tier(ROWS, [1, 3])


def triton_test(fn):
    """The marks of every Triton test (tests/kernels/kernel_cases.py)."""
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def _rand(*shape, dtype=torch.float32, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def _case(m, n, k, dtype, seed=0):
    """x, residual, norm_weight, w, bias with the magnitudes of a model's tensors."""
    return (_rand(m, k, dtype=dtype, seed=seed), _rand(m, k, dtype=dtype, seed=seed + 1),
            _rand(k, dtype=dtype, scale=0.2, seed=seed + 2).add_(1.0), _rand(n, k, dtype=dtype, scale=0.05, seed=seed + 3),
            _rand(n, dtype=dtype, seed=seed + 4))


# --- (a) references: always run ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_references_are_the_unfused_references(dtype):
    x, r, nw, w, b = (t.cpu() for t in _case(5, 48, 64, dtype))
    gate_up = _rand(5, 128, dtype=dtype).cpu()
    w_down = _rand(48, 64, dtype=dtype, scale=0.05, seed=9).cpu()
    assert torch.equal(ref.skinny_linear_reference(x, w, b), (x.float() @ w.float().t() + b.float()).to(dtype))
    assert torch.equal(ref.skinny_linear_reference(x, w), (x.float() @ w.float().t()).to(dtype))
    h, new_r = ref.rms_norm_reference(x, nw, EPS, r)
    y, got_r = ref.rms_norm_linear_reference(x, r, nw, EPS, w, b)
    assert torch.equal(y, ref.skinny_linear_reference(h, w, b)) and torch.equal(got_r, new_r)
    y, got_r = ref.rms_norm_linear_reference(x, None, nw, EPS, w)
    assert torch.equal(y, ref.skinny_linear_reference(ref.rms_norm_reference(x, nw, EPS), w)) and got_r is x
    assert torch.equal(ref.silu_mul_linear_reference(gate_up, w_down),
                       ref.skinny_linear_reference(ref.silu_and_mul_reference(gate_up), w_down))


def test_cpu_dispatch_and_out():
    x, r, nw, w, b = (t.cpu() for t in _case(3, 40, 32, torch.float32))
    out = torch.full((3, 40), float("nan"))
    assert kernels.skinny_linear(x, w, b, out=out) is out
    assert torch.equal(out, ref.skinny_linear_reference(x, w, b))
    y, new_r = kernels.rms_norm_linear(x, r, nw, EPS, w, b)
    expected = ref.rms_norm_linear_reference(x, r, nw, EPS, w, b)
    assert torch.equal(y, expected[0]) and torch.equal(new_r, expected[1])
    gate_up = _rand(3, 64).cpu()
    assert torch.equal(kernels.silu_mul_linear(gate_up, w), ref.silu_mul_linear_reference(gate_up, w))


def test_max_rows_constant_matches_the_kernel():
    pytest.importorskip("triton")
    from kernels.skinny_gemm import MAX_M

    assert kernels.SKINNY_MAX_M == MAX_M


def _count_fused_rope(monkeypatch, layers) -> list:
    """Counts the skinny layer's fused norm + qkv + rope launches (layers.rms_norm_qkv_rope)."""
    calls, fused = [], layers.rms_norm_qkv_rope
    monkeypatch.setattr(layers, "rms_norm_qkv_rope", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    return calls


def test_model_skinny_path_matches_default_path_on_cpu(tmp_path, monkeypatch):
    """The fused layer wiring (via the references on CPU, forced on) == the default path, the qkv
    GEMM + rope + KV write fused for Qwen2 (bias), not for Qwen3 (q/k norm); and with the switch
    on, CPU tensors never take it."""
    from executor_svc.model_loader.random_model import build_random_model
    from executor_svc.model_loader.safetensors import load_model
    from executor_svc.models import layers
    from executor_svc.startup.kv_cache import allocate_kv_caches
    from tests.executor.models.test_model import _prefill_meta

    for arch in ("tiny-qwen2", "tiny-qwen3"):  # qkv bias; q/k norm
        model = load_model(build_random_model(tmp_path / arch, arch), "cpu", torch.float32)
        model.skinny_max_tokens = 16
        assert not layers.use_skinny(torch.zeros(4, 2), model.skinny_max_tokens)
        ids = torch.randint(0, model.args.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
        outs = []
        for forced in (False, True):
            if forced:
                monkeypatch.setattr(layers, "use_skinny", lambda x, max_tokens: 0 < x.shape[0] <= max_tokens)
                fused_calls = _count_fused_rope(monkeypatch, layers)
            caches = allocate_kv_caches(model.args, 4, 16, torch.float32, torch.device("cpu"))
            with torch.inference_mode():
                hidden = model(ids, torch.arange(12), _prefill_meta(12, [2], 16), caches)
                outs.append((hidden, model.compute_logits(hidden)))
        monkeypatch.undo()
        assert len(fused_calls) == (model.args.num_layers if arch == "tiny-qwen2" else 0)
        torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(outs[1][1], outs[0][1], atol=1e-5, rtol=1e-5)


# --- (b) Triton kernels vs references ---------------------------------------------------------
# The shape sweeps use default_config (each tuning compiles every config: slow); every config and
# the tuned choice are checked at one shape in test_every_config_and_determinism.

def _configs(m, k):
    """Every candidate config on CUDA; a split and a no-split one interpreted."""
    from kernels.skinny_gemm import CONFIGS, SkinnyConfig, fits

    if ON_CUDA:
        return [c for c in CONFIGS if fits(c, m, k)]
    cc = [SkinnyConfig(8, 64, 4, 1, 1, False), SkinnyConfig(4, 64, 2, 1, 3, False)] if m > 1 else []
    return [SkinnyConfig(32, 64, 4, 1, 1), SkinnyConfig(16, 64, 4, 1, 3)] + cc


def _sweep_configs(m, n, k):
    """The untuned default, and for 2+ rows also a CUDA-core (dot=False) config."""
    from kernels.skinny_gemm import default_config

    cfg = default_config(m, n, k)
    return [cfg] + ([cfg._replace(block_n=8, dot=False)] if m > 1 else [])


@triton_test
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("n,k", FAST_SHAPES)
@pytest.mark.parametrize("m", FAST_ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_linear(m, n, k, dtype, with_bias, with_residual):
    from kernels.skinny_gemm import rms_norm_linear_triton

    x, r, nw, w, b = _case(m, n, k, dtype, seed=m)
    r, b = (r if with_residual else None), (b if with_bias else None)
    y_ref, r_ref = ref.rms_norm_linear_reference(x, r, nw, EPS, w, b)
    for cfg in _sweep_configs(m, n, k):
        y, new_r = rms_norm_linear_triton(x, r, nw, EPS, w, b, cfg)
        assert y.dtype == dtype and y.shape == (m, n)
        assert rel_err(y, y_ref) < tolerance(dtype), cfg
        assert (new_r is x) if r is None else torch.equal(new_r, r_ref)


@triton_test
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("n,k", FAST_SHAPES)
@pytest.mark.parametrize("m", FAST_ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear(m, n, k, dtype, with_bias):
    from kernels.skinny_gemm import skinny_linear_triton

    x, _, _, w, b = _case(m, n, k, dtype, seed=m)
    b = b if with_bias else None
    y_ref = ref.skinny_linear_reference(x, w, b)
    for cfg in _sweep_configs(m, n, k):
        assert rel_err(skinny_linear_triton(x, w, b, config=cfg), y_ref) < tolerance(dtype), cfg


@triton_test
@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("n,k", FAST_SHAPES)
@pytest.mark.parametrize("m", FAST_ROWS)
def test_silu_mul_linear(m, n, k, dtype):
    from kernels.skinny_gemm import silu_mul_linear_triton

    gate_up = _rand(m, 2 * k, dtype=dtype, seed=m)
    w = _rand(n, k, dtype=dtype, scale=0.05, seed=m + 1)
    for cfg in _sweep_configs(m, n, k):
        y = silu_mul_linear_triton(gate_up, w, cfg)
        assert rel_err(y, ref.silu_mul_linear_reference(gate_up, w)) < tolerance(dtype), cfg


@triton_test
@pytest.mark.parametrize("m", tier([1, 5, 16], [5]))
def test_every_config_and_determinism(m):
    """Each config (split-K included) matches the reference, and repeats bit for bit."""
    from kernels.skinny_gemm import (
        rms_norm_linear_triton,
        silu_mul_linear_triton,
        skinny_linear_triton,
    )

    dtype = DTYPES[0]
    n, k = (3072, 2048) if ON_CUDA else (100, 320)
    x, r, nw, w, b = _case(m, n, k, dtype, seed=7)
    gate_up = _rand(m, 2 * k, dtype=dtype, seed=8)
    w_down = _rand(n, k, dtype=dtype, scale=0.05, seed=9)
    expected = (ref.skinny_linear_reference(x, w, b), ref.rms_norm_linear_reference(x, r, nw, EPS, w, b)[0],
                ref.silu_mul_linear_reference(gate_up, w_down))
    for cfg in _configs(m, k) + [None]:  # None: the tuned (CUDA) or default config
        runs = [(skinny_linear_triton(x, w, b, config=cfg), rms_norm_linear_triton(x, r, nw, EPS, w, b, cfg)[0],
                 silu_mul_linear_triton(gate_up, w_down, cfg)) for _ in range(2)]
        for got, want in zip(runs[0], expected):
            assert rel_err(got, want) < tolerance(dtype), cfg
        assert all(torch.equal(a, c) for a, c in zip(*runs)), f"not deterministic: {cfg}"


@triton_test
def test_out_argument():
    from kernels.skinny_gemm import SkinnyConfig, skinny_linear_triton

    dtype = DTYPES[0]
    x, _, _, w, _ = _case(3, 1000, 576, dtype)
    expected = skinny_linear_triton(x, w)
    buffer = torch.full((8, 1000), float("nan"), dtype=dtype, device=DEVICE)  # like GraphRunner.logits
    out = skinny_linear_triton(x, w, out=buffer[:3])
    assert out.data_ptr() == buffer.data_ptr() and torch.equal(out, expected) and torch.isnan(buffer[3:]).all()
    buffer.fill_(float("nan"))
    skinny_linear_triton(x, w, out=buffer[:3], config=SkinnyConfig(32, 64, 4, 1, 3))  # split-K
    assert rel_err(buffer[:3], expected) < tolerance(dtype) and torch.isnan(buffer[3:]).all()


@triton_test
def test_bad_arguments_raise():
    from kernels.skinny_gemm import (
        rms_norm_linear_triton,
        silu_mul_linear_triton,
        skinny_linear_triton,
    )

    w = _rand(40, 32)
    with pytest.raises(ValueError, match="rows"):
        skinny_linear_triton(_rand(17, 32), w)
    with pytest.raises(ValueError, match="columns"):
        skinny_linear_triton(_rand(2, 30), w)
    with pytest.raises(ValueError, match="columns"):
        silu_mul_linear_triton(_rand(2, 32), w)
    with pytest.raises(ValueError, match="dtype"):
        skinny_linear_triton(_rand(2, 32, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_linear_triton(_rand(2, 32), _rand(3, 32), _rand(32), EPS, w)
    with pytest.raises(ValueError, match="out"):
        skinny_linear_triton(_rand(2, 32), w, out=_rand(2, 41))




# --- (c) the model on a GPU: skinny path on == off ------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_model_greedy_tokens_equal_with_skinny_on_and_off(tmp_path, monkeypatch, arch):
    """float32 tiny model: eager decode tokens with the skinny path off == on, with the fused
    norm + qkv + rope + KV write (kernels/skinny_rope.py) and without it (batches 1, 5, 16), then
    graphs re-captured with it on (fused) replay the same tokens as eager steps."""
    from executor_svc.model_loader.random_model import build_random_model
    from executor_svc.models import layers
    from executor_svc.models.llama import Attention
    from tests.executor.cuda_helpers import (
        Driver,
        check_graph_tokens_equal_eager,
        cuda_runner,
    )

    # mixed graphs: those the prefills of 1, 5 and 16 prompts of 40 tokens take (of the default sizes)
    runner = cuda_runner(build_random_model(tmp_path / arch, arch), dtype="float32", max_num_seqs=16,
                         cuda_graph_sizes=(1, 2, 4, 8, 16), mixed_cuda_graph_sizes=(64, 224, 640),
                         num_kv_blocks=16 * 16 + 1)
    model = runner.model
    fused_calls, fuses_rope = _count_fused_rope(monkeypatch, layers), Attention.fuses_rope
    runner.use_graphs(False)
    try:
        for num_reqs in (1, 5, 16):
            tokens = {}
            for max_tokens, fuse in ((0, True), (kernels.SKINNY_MAX_M, True), (kernels.SKINNY_MAX_M, False)):
                model.skinny_max_tokens = max_tokens
                monkeypatch.setattr(Attention, "fuses_rope", fuses_rope if fuse else lambda self, x, kv_cache: False)
                calls = len(fused_calls)
                driver = Driver(runner, num_reqs)
                driver.decode(6)
                tokens[max_tokens, fuse] = driver.tokens
                assert (len(fused_calls) > calls) == (max_tokens > 0 and fuse)
            skinny = kernels.SKINNY_MAX_M
            assert tokens[0, True] == tokens[skinny, True] == tokens[skinny, False], num_reqs
    finally:
        runner.use_graphs(True)
        monkeypatch.setattr(Attention, "fuses_rope", fuses_rope)
    runner.graphs.capture()  # re-record every size with the skinny path on (fused)
    for num_reqs in (1, 5, 16):
        check_graph_tokens_equal_eager(runner, num_reqs)
