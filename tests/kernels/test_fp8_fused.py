"""Activation quantization fused into RMSNorm / SiLU-and-mul for the FP8 w8a8 GEMM
(kernels/fp8_fused.py): the references are the unfused references in sequence (CPU, always); the
host-side choice (`fused_quant_group`); the Triton kernels bit-equal to the unfused Triton kernels
in sequence (norm or SiLU, then `_quant_kernel`: CUDA and the interpreter, whose e4m3 cast both
paths share) and close to the references; the w8a8 GEMM taking an Fp8Activation; CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import fp8_reference as ref
from kernels import reference
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, rel_err, tier, tolerance
from tests.kernels.test_fp8_gemm import fp8_case, triton_test

DTYPE = torch.bfloat16 if ON_CUDA else torch.float16
GROUPS = [None, 128]  # per token (tensor / channel weights); 128-column groups (128 x 128 blocks)


def _x(m, k, dtype=DTYPE, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, m)[:, None]
    return x.to(dtype).to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


# --- references and host logic (CPU, always) ----------------------------------------------------

@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_quant_reference_is_the_unfused_references(group, with_residual):
    x, w = _x(9, 256, torch.bfloat16, device="cpu"), torch.rand(256) + 0.5
    r = _x(9, 256, torch.bfloat16, seed=1, device="cpu") if with_residual else None
    got = ref.rms_norm_quant_reference(x, w, 1e-6, r, group)
    act, new_r = got if with_residual else (got, None)
    y = reference.rms_norm_reference(x, w, 1e-6, r)
    y, r_want = y if with_residual else (y, None)
    q, s = ref.quantize_activations_reference(y, group or 256)
    assert torch.equal(_bits(act.q), _bits(q)) and torch.equal(act.scale, s) and act.dtype == torch.bfloat16
    if with_residual:
        assert torch.equal(new_r, r_want)
    assert kernels.rms_norm_quant(x, w, 1e-6, r, group)[0 if with_residual else slice(None)] is not None


@pytest.mark.parametrize("group", GROUPS)
def test_silu_and_mul_quant_reference_and_quantized_linear(group):
    x = _x(5, 512, torch.bfloat16, device="cpu")
    act = kernels.silu_and_mul_quant(x, group)
    q, s = ref.quantize_activations_reference(reference.silu_and_mul_reference(x), group or 256)
    assert torch.equal(_bits(act.q), _bits(q)) and torch.equal(act.scale, s)
    strategy, block = ("channel", None) if group is None else ("block", (64, group))
    w, ws, b = fp8_case(96, 256, strategy, block)
    y = kernels.fp8_linear(act, w, ws, strategy, block, b.bfloat16())  # CPU: the quantized reference
    y_unfused = ref.w8a8_linear_reference(reference.silu_and_mul_reference(x), w, ws, strategy, block, b.bfloat16())
    assert torch.equal(y, y_unfused)


def test_fused_quant_group_follows_the_w8a8_path():
    bf, top = torch.bfloat16, ref.W8A16_MAX_M  # up to top rows: w8a16, dense inputs
    assert [ref.fused_quant_group(m, bf, "channel", None, 2048) for m in (1, 16, top, top + 1, 256)] == \
        [None, None, None, 2048, 2048]
    assert ref.fused_quant_group(256, bf, "tensor", None, 8192) == 8192
    assert ref.fused_quant_group(256, bf, "block", (128, 128), 2048) == 128
    assert ref.fused_quant_group(256, bf, "block", (32, 48), 2048) is None  # the dequantize path
    assert ref.fused_quant_group(256, bf, "block", (32, 96), 2048) is None  # w8a8, but 96-column groups
    assert ref.fused_quant_group(256, torch.float32, "channel", None, 2048) is None
    assert ref.fused_quant_group(256, bf, "channel", None, ref.FUSED_MAX_K * 2) is None


# --- Triton ---------------------------------------------------------------------------------------

@triton_test
@pytest.mark.parametrize("group", GROUPS + [512])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("m,k", tier([(1, 2048), (37, 1000), (130, 2048)], [(37, 1000)]) if ON_CUDA
                         else [(3, 1000), (7, 512)])
def test_rms_norm_quant_kernel_equals_the_unfused_kernels(m, k, with_residual, group):
    from kernels.fp8_fused import rms_norm_quant_triton
    from kernels.fp8_w8a8 import quantize_activations_triton
    from kernels.norm import rms_norm_triton

    x, w = _x(m, k), (torch.rand(k) + 0.5).to(DTYPE).to(DEVICE)
    x[0] = 0  # without a residual, an all-zero row: zeros and the minimum scale
    r = _x(m, k, seed=2) if with_residual else None
    got = rms_norm_quant_triton(x, w, 1e-6, r, group)
    act, new_r = got if with_residual else (got, None)
    y = rms_norm_triton(x, w, 1e-6, r)
    y, r_want = y if with_residual else (y, None)
    q, s = quantize_activations_triton(y, group or k)
    assert act.q.shape == (m, k) and act.scale.shape == s.shape and act.dtype == DTYPE
    assert torch.equal(_bits(act.q), _bits(q)) and torch.equal(act.scale, s)
    if with_residual:
        assert torch.equal(new_r, r_want)
    want = ref.rms_norm_quant_reference(x.cpu(), w.cpu(), 1e-6, None if r is None else r.cpu(), group)
    want = want[0] if with_residual else want
    # the reference: torch's rsqrt may round the norm an ulp of the dtype apart (a different e4m3
    # step now and then); interpreted, the truncating cast (docs/kernels.md) adds a few more
    assert rel_err(act.scale, want.scale) < 1e-2
    mismatch = (_bits(act.q) != _bits(want.q)).float().mean().item()
    assert mismatch < (0.01 if ON_CUDA else 0.05)


@triton_test
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("m,inter", tier([(1, 8192), (64, 8192), (33, 1000)], [(33, 1000)]) if ON_CUDA
                         else [(3, 1000), (5, 256)])
def test_silu_and_mul_quant_kernel_equals_the_unfused_kernels(m, inter, group):
    from kernels.activation import silu_and_mul_triton
    from kernels.fp8_fused import silu_and_mul_quant_triton
    from kernels.fp8_w8a8 import quantize_activations_triton

    x = _x(m, 2 * inter, seed=3)
    act = silu_and_mul_quant_triton(x, group)
    q, s = quantize_activations_triton(silu_and_mul_triton(x), group or inter)
    assert torch.equal(_bits(act.q), _bits(q)) and torch.equal(act.scale, s)


@triton_test
@pytest.mark.parametrize("strategy,block,backend", [("channel", None, "scaled_mm"), ("channel", None, "triton"),
                                                    ("tensor", None, "triton"), ("block", (128, 128), "triton")])
def test_w8a8_gemm_takes_fp8_activations(strategy, block, backend):
    from kernels.fp8_gemm import fp8_linear_triton
    from kernels.fp8_w8a8 import w8a8_linear_triton

    if backend == "scaled_mm" and (not ON_CUDA or DTYPE != torch.bfloat16):
        pytest.skip("torch._scaled_mm: CUDA, bf16")
    n, k = (2048, 2048) if ON_CUDA else (96, 256)
    w, ws, b = fp8_case(n, k, strategy, block, seed=7, device=DEVICE)
    x, norm_w = _x(40, k, seed=4), (torch.rand(k) + 0.5).to(DTYPE).to(DEVICE)
    act = kernels.rms_norm_quant(x, norm_w, 1e-6, None, ref.fused_quant_group(80, DTYPE, strategy, block, k))
    y = w8a8_linear_triton(act, w, ws, strategy, block, b.to(DTYPE), backend=backend)
    want = ref.w8a8_quantized_linear_reference(
        ref.Fp8Activation(act.q.cpu(), act.scale.cpu(), DTYPE), w.cpu(), ws.cpu(), strategy, block, b.to(DTYPE).cpu())
    assert y.dtype == DTYPE and rel_err(y, want) < tolerance(DTYPE)
    assert torch.equal(fp8_linear_triton(act, w, ws, strategy, block, b.to(DTYPE)),
                       w8a8_linear_triton(act, w, ws, strategy, block, b.to(DTYPE)))
    with pytest.raises(ValueError, match="x.scale"):  # per-token scales for block weights, or the reverse
        bad = ref.Fp8Activation(act.q, torch.ones(40, 1 if strategy == "block" else 2, device=DEVICE), DTYPE)
        w8a8_linear_triton(bad, w, ws, strategy, block)


@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA")
def test_fused_norm_quant_and_gemm_replay_in_a_cuda_graph():
    n, k, m = 3072, 2048, 128
    w, ws, _ = fp8_case(n, k, "channel", None, device="cuda")
    x, r = _x(m, k), _x(m, k, seed=1)
    norm_w = (torch.rand(k) + 0.5).bfloat16().cuda()

    def step():
        act, new_r = kernels.rms_norm_quant(x, norm_w, 1e-6, r, k)
        return kernels.fp8_linear(act, w, ws, "channel"), new_r

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, new_r = step()
    for seed in (5, 6):
        x.copy_(_x(m, k, seed=seed)), r.copy_(_x(m, k, seed=seed + 10))
        graph.replay()
        torch.cuda.synchronize()
        y_eager, r_eager = step()
        assert torch.equal(y, y_eager) and torch.equal(new_r, r_eager)
