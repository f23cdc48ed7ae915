"""FP8 weight GEMMs (kernels/fp8_gemm.py, fp8_w8a8.py): the references (CPU, always), the Triton
paths vs the references (CUDA; or CPU under TRITON_INTERPRET=1 with small shapes, fp16/fp32: the
interpreter's tl.dot mishandles bf16, and its fp32 -> e4m3 cast truncates at binade boundaries,
so there the w8a8 GEMM takes the reference's quantized activations), and CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import fp8_reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, rel_err, tier, tolerance

FP8 = torch.float8_e4m3fn
STRATEGIES = [("tensor", None), ("channel", None), ("block", (128, 128))]
# (N, K): llama-1b qkv, o, gate_up, down; qwen3-0.6b qkv (16 + 2 x 8 heads of 128), o, gate_up, down
MODEL_SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192),
                (4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]
SHAPES = MODEL_SHAPES + [(1000, 576)] if ON_CUDA else [(200, 320), (72, 200)]  # partial N / K tiles
ROWS = [1, 2, 8, 16, 32, 64, 65, 256, 1000] if ON_CUDA else [1, 3, 16, 40, 70]
DTYPE = torch.bfloat16 if ON_CUDA else torch.float16
# the fast tier's sweep: a model shape and the partial tiles; the GEMV, a w8a16 tile, w8a8
FAST_SHAPES, FAST_ROWS = tier(SHAPES, [(3072, 2048), (1000, 576)]), tier(ROWS, [1, 16, 65])


def triton_test(fn):
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def fp8_case(n, k, strategy, block, seed=0, device="cpu"):
    """fp8 weight (values over the whole e4m3 range) and positive float32 scales of a real layer."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 120).clamp(-448, 448).to(FP8)
    shape = {"tensor": (1,), "channel": (n,)}.get(strategy) or (-(-n // block[0]), -(-k // block[1]))
    scale = torch.rand(shape, generator=gen) * 2e-4 + 1e-4
    bias = torch.randn(n, generator=gen) * 0.1
    return w.to(device), scale.to(device), bias.to(device)


def _x(m, k, dtype, seed=1, device="cpu"):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


# --- references (CPU, always) ------------------------------------------------------------------

@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (32, 48))])
def test_dequantize_reference_matches_tile_loops(strategy, block):
    n, k = 100, 200  # partial blocks in both dims
    w, s, _ = fp8_case(n, k, strategy, block)
    expected = torch.empty(n, k)
    for i in range(n):
        for j0 in range(0, k, 50):
            cols = slice(j0, j0 + 50)
            if strategy == "block":
                expected[i, cols] = w[i, cols].float() * s[i // block[0], torch.arange(j0, j0 + 50) // block[1]]
            else:
                expected[i, cols] = w[i, cols].float() * (s[0] if strategy == "tensor" else s[i])
    assert torch.equal(ref.dequantize_fp8_reference(w, s, strategy, block), expected)


@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (32, 48))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a16_reference_is_dequantize_then_fp32_matmul(strategy, block, dtype, with_bias):
    w, s, b = fp8_case(130, 260, strategy, block)
    x, b = _x(5, 260, dtype), (b.to(dtype) if with_bias else None)
    y = x.float() @ ref.dequantize_fp8_reference(w, s, strategy, block).t()
    expected = (y + b.float() if with_bias else y).to(dtype)
    assert torch.equal(ref.w8a16_linear_reference(x, w, s, strategy, block, b), expected)


@pytest.mark.parametrize("group", [260, 128, 48])
def test_activation_quantization_is_within_e4m3_rounding(group):
    x = _x(7, 260, torch.float32) * torch.logspace(-3, 2, 7)[:, None]
    q, scale = ref.quantize_activations_reference(x, group)
    assert q.dtype == FP8 and scale.shape == (7, -(-260 // group))
    s = scale.repeat_interleave(group, dim=1)[:, :260]
    back = q.float() * s
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal spacing 2^-9 (absolute <= s 2^-10)
    assert ((back - x).abs() <= x.abs() * 2**-4 + s * 2**-10 + 1e-30).all()
    amax = torch.nn.functional.pad(x.abs(), (0, scale.shape[1] * group - 260)).view(7, -1, group).amax(2)
    assert torch.equal(scale, amax / 448)  # each group's largest magnitude lands on 448


def test_an_all_zero_row_quantizes_to_zeros_without_nan():
    x = _x(3, 256, torch.bfloat16)
    x[1] = 0
    for group in (256, 128):
        q, scale = ref.quantize_activations_reference(x, group)
        assert torch.equal(q[1].float(), torch.zeros(256)) and (scale[1] == ref.FP8_MIN_SCALE).all()
    w, s, b = fp8_case(64, 256, "channel", None)
    y = ref.w8a8_linear_reference(x, w, s, "channel", None, b.bfloat16())
    assert not y.isnan().any() and torch.equal(y[1], b.bfloat16())


@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (64, 32))])
def test_w8a8_reference_error_is_what_e4m3_activations_allow(strategy, block):
    w, s, _ = fp8_case(256, 512, strategy, block)
    x = _x(32, 512, torch.float32)
    exact = x @ ref.dequantize_fp8_reference(w, s, strategy, block).t()
    err = rel_err(ref.w8a8_linear_reference(x, w, s, strategy, block), exact)
    assert 1e-3 < err < 2**-4 / 3**0.5 * 1.2  # random inputs: ~ the rms of a uniform 2^-4 relative error


def test_cpu_dispatch_uses_the_references():
    w, s, b = fp8_case(48, 64, "block", (16, 32))
    x = _x(2, 3 * 64, torch.float32).view(2, 3, 64)  # leading dims are kept
    y = kernels.fp8_linear(x, w, s, "block", (16, 32), b)
    assert y.shape == (2, 3, 48)
    assert torch.equal(y.view(6, 48), ref.w8a16_linear_reference(x.view(6, 64), w, s, "block", (16, 32), b))
    y8 = kernels.fp8_linear(x.view(6, 64), w, s, "block", (16, 32), b, path="w8a8")
    assert torch.equal(y8, ref.w8a8_linear_reference(x.view(6, 64), w, s, "block", (16, 32), b))


def test_max_rows_constant_matches_the_kernel():
    pytest.importorskip("triton")
    from kernels.fp8_gemm import W8A16_MAX_M

    assert kernels.FP8_W8A16_MAX_M == W8A16_MAX_M


# --- Triton paths vs references ------------------------------------------------------------------

@pytest.fixture
def reference_quantization(monkeypatch):
    """Interpreted: the w8a8 GEMM takes the reference's quantized activations (see the docstring)."""
    if not ON_CUDA:
        import kernels.fp8_w8a8 as w8a8

        monkeypatch.setattr(w8a8, "quantize_activations_triton", ref.quantize_activations_reference)


@triton_test
@pytest.mark.parametrize("strategy,block", STRATEGIES)
@pytest.mark.parametrize("n,k", FAST_SHAPES)
@pytest.mark.parametrize("m", FAST_ROWS)
def test_fp8_linear_matches_its_reference(m, n, k, strategy, block, reference_quantization):
    """The dispatch: <= 64 rows the w8a16 kernel (vs the w8a16 reference), more the w8a8 GEMM (vs
    the w8a8 reference); outputs in x's dtype, bias included."""
    from kernels.fp8_gemm import W8A16_MAX_M, fp8_linear_triton

    w, s, b = fp8_case(n, k, strategy, block, seed=m, device=DEVICE)
    x, b = _x(m, k, DTYPE, seed=m, device=DEVICE), b.to(DTYPE)
    y = fp8_linear_triton(x, w, s, strategy, block, b)
    reference = ref.w8a16_linear_reference if m <= W8A16_MAX_M else ref.w8a8_linear_reference
    assert y.dtype == DTYPE and y.shape == (m, n)
    assert rel_err(y, reference(x, w, s, strategy, block, b)) < tolerance(DTYPE), (m, n, k, strategy)


@triton_test
@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (32, 48))])
@pytest.mark.parametrize("dtype", tier([torch.float32, DTYPE], [DTYPE]))
@pytest.mark.parametrize("m", tier([1, 5, 16, 33, 64], [1, 33]))  # the fast tier: 1- and 64-row tiles
def test_w8a16_every_config_and_determinism(m, dtype, strategy, block):
    """Each candidate config that fits (split-K included) and the tuned one match the reference and
    repeat bit for bit; bk = 48 runs 16-column K tiles."""
    from kernels.fp8_gemm import W8A16_CONFIGS, w8a16_fits, w8a16_linear_triton
    from kernels.skinny_gemm import SkinnyConfig

    n, k = (3072, 2048) if ON_CUDA else (100, 320)
    w, s, b = fp8_case(n, k, strategy, block, seed=3, device=DEVICE)
    x, b = _x(m, k, dtype, device=DEVICE), b.to(dtype)
    expected = ref.w8a16_linear_reference(x, w, s, strategy, block, b)
    configs = list(W8A16_CONFIGS) if ON_CUDA else [SkinnyConfig(16, 16, 4, 1, 1), SkinnyConfig(32, 16, 4, 1, 3)]
    for cfg in [c for c in configs if w8a16_fits(c, m, k, strategy, block)] + [None]:
        runs = [w8a16_linear_triton(x, w, s, strategy, block, b, config=cfg) for _ in range(2)]
        assert rel_err(runs[0], expected) < tolerance(dtype), cfg
        assert torch.equal(runs[0], runs[1]), f"not deterministic: {cfg}"


@triton_test
@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (64, 256))])
@pytest.mark.parametrize("backend", ["triton", "scaled_mm"])
@pytest.mark.parametrize("dtype", tier([torch.bfloat16, torch.float16], [torch.bfloat16]))
def test_w8a8_backends(backend, strategy, block, dtype, reference_quantization):
    from kernels.fp8_w8a8 import w8a8_linear_triton

    if backend == "scaled_mm" and (strategy == "block" or dtype != torch.bfloat16):
        pytest.skip("torch._scaled_mm serves bf16 tensor / channel weights")
    if not ON_CUDA and (backend == "scaled_mm" or dtype == torch.bfloat16):
        pytest.skip("interpreted: fp16 Triton only")
    n, k = (2048, 2048) if ON_CUDA else (96, 512)
    w, s, b = fp8_case(n, k, strategy, block, seed=5, device=DEVICE)
    for m in (17, 100):  # w8a8 runs any row count (fp8_path sends it those beyond W8A16_MAX_M)
        x, bias = _x(m, k, dtype, seed=m, device=DEVICE), b.to(dtype)
        y = w8a8_linear_triton(x, w, s, strategy, block, bias, backend=backend)
        assert rel_err(y, ref.w8a8_linear_reference(x, w, s, strategy, block, bias)) < tolerance(dtype)


@triton_test
@pytest.mark.parametrize("strategy,block", STRATEGIES + [("block", (64, 96))])
@pytest.mark.parametrize("m", tier([17, 100, 256], [100]))
def test_w8a8_every_config_and_determinism(m, strategy, block, reference_quantization):
    """Each Triton candidate that fits (split-K, a last split's K tiles past K included) and the
    tuned pick match the w8a8 reference and repeat bit for bit; bk = 96 runs 32-deep K tiles."""
    from kernels.fp8_w8a8 import W8A8_CONFIGS, W8A8Config, w8a8_fits, w8a8_linear_triton

    n, k = (2048, 2048) if ON_CUDA else (96, 320)
    dtype = DTYPE if ON_CUDA else torch.float16
    w, s, b = fp8_case(n, k, strategy, block, seed=7, device=DEVICE)
    x, b = _x(m, k, dtype, seed=m, device=DEVICE), b.to(dtype)
    expected = ref.w8a8_linear_reference(x, w, s, strategy, block, b)
    k_tile_max = ref.pow2_divisor(block[1], 256) if block else 256
    configs = list(W8A8_CONFIGS) if ON_CUDA else [W8A8Config(16, 16, 32, 4, 1), W8A8Config(32, 16, 32, 4, 1, 3)]
    tried = [c for c in configs if w8a8_fits(c, k, k_tile_max)]
    assert any(c.split_k > 1 for c in tried)
    for cfg in tried + [None]:
        runs = [w8a8_linear_triton(x, w, s, strategy, block, b, backend="triton", config=cfg) for _ in range(2)]
        assert rel_err(runs[0], expected) < tolerance(dtype), cfg
        assert torch.equal(runs[0], runs[1]), f"not deterministic: {cfg}"


@triton_test
def test_w8a8_default_config_splits_k_where_the_grid_is_small():
    """llama-1b at 256 rows: qkv, o and down ([128, 128] tiles: 48, 32, 32 programs) split K 4 ways,
    gate_up (256 programs) not; prefill-sized grids never split; block weights keep K tiles in bk."""
    from kernels.fp8_w8a8 import W8A8Config, w8a8_default_config

    assert [w8a8_default_config(256, n, k).split_k for n, k in MODEL_SHAPES[:4]] == [4, 4, 1, 4]
    assert w8a8_default_config(4096, 2048, 8192) == W8A8Config(128, 128, 128, 8, 3, 1)
    assert w8a8_default_config(100, 2048, 2048, 32) == W8A8Config(128, 128, 32, 8, 3, 4)


@triton_test
@pytest.mark.parametrize("group", [128, 2048, 48])
def test_activation_quantization_kernel_matches_the_reference(group):
    from kernels.fp8_w8a8 import quantize_activations_triton

    x = _x(37, 2048, DTYPE, device=DEVICE) * torch.logspace(-3, 2, 37, device=DEVICE)[:, None].to(DTYPE)
    x[5] = 0
    q, scale = quantize_activations_triton(x, group)
    q_ref, scale_ref = ref.quantize_activations_reference(x, group)
    assert torch.equal(scale, scale_ref)
    mismatch = (q.view(torch.uint8) != q_ref.view(torch.uint8)).float().mean().item()
    assert mismatch == 0 if ON_CUDA else mismatch < 0.05  # interpreted: the truncating cast


@triton_test
def test_fp8_linear_fallbacks_and_fp32():
    """bk without a power-of-two divisor >= 32 and fp32 activations beyond 64 rows: dequantize path."""
    from kernels.fp8_gemm import W8A16_MAX_M, fp8_linear_triton, fp8_path

    beyond = W8A16_MAX_M + 1
    assert fp8_path(beyond, torch.bfloat16, "block", (32, 48)) == "dequantize"
    assert fp8_path(beyond, torch.float32, "channel", None) == "dequantize"
    assert fp8_path(4, torch.bfloat16, "block", (32, 48)) == "w8a16"
    assert fp8_path(64, torch.bfloat16, "block", (32, 48)) == "w8a16"
    assert fp8_path(beyond, torch.bfloat16, "block", (128, 128)) == "w8a8"
    w, s, b = fp8_case(96, 192, "block", (32, 48), device=DEVICE)
    for m, dtype in ((40, DTYPE), (beyond, DTYPE), (beyond, torch.float32)):
        x = _x(m, 192, dtype, device=DEVICE)
        y = fp8_linear_triton(x, w, s, "block", (32, 48), b.to(dtype))
        assert rel_err(y, ref.w8a16_linear_reference(x, w, s, "block", (32, 48), b.to(dtype))) < tolerance(dtype)


@triton_test
def test_bad_arguments_raise():
    from kernels.fp8_gemm import W8A16_MAX_M, w8a16_linear_triton

    w, s, _ = fp8_case(40, 64, "channel", None, device=DEVICE)
    with pytest.raises(ValueError, match="rows"):
        w8a16_linear_triton(_x(W8A16_MAX_M + 1, 64, DTYPE, device=DEVICE), w, s, "channel")
    with pytest.raises(ValueError, match="columns"):
        w8a16_linear_triton(_x(2, 60, DTYPE, device=DEVICE), w, s, "channel")
    with pytest.raises(ValueError, match="weight_scale"):
        w8a16_linear_triton(_x(2, 64, DTYPE, device=DEVICE), w, s[:3], "channel")
    with pytest.raises(ValueError, match="dtype"):
        w8a16_linear_triton(_x(2, 64, DTYPE, device=DEVICE), w.float(), s, "channel")
    with pytest.raises(ValueError, match="strategy"):
        w8a16_linear_triton(_x(2, 64, DTYPE, device=DEVICE), w, s, "group")


@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("strategy,block", tier(STRATEGIES, [("channel", None)]))  # fast: --quantization fp8's
def test_cuda_graph_replay_equals_eager(strategy, block):
    """Each path captured (after an eager warm-up that tunes) and replayed on new inputs in the
    same static buffer gives the eager result."""
    from kernels.fp8_gemm import fp8_linear_triton

    n, k = 3072, 2048
    w, s, b = fp8_case(n, k, strategy, block, device="cuda")
    b = b.bfloat16()
    for m in (1, 8, 16, 32, 64, 65, 256):
        x = _x(m, k, torch.bfloat16, device="cuda")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fp8_linear_triton(x, w, s, strategy, block, b)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fp8_linear_triton(x, w, s, strategy, block, b)
        for seed in (2, 3):
            x.copy_(_x(m, k, torch.bfloat16, seed=seed, device="cuda"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, fp8_linear_triton(x, w, s, strategy, block, b)), (m, seed)
