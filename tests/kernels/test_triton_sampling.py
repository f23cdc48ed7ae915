"""The fused Gumbel-max sampling kernel against its reference (CUDA, or TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, tier

pytestmark = TRITON_MARKS


# --- Gumbel-max sampling -----------------------------------------------------------------------
# Comparison: token ids equal to the reference run on the same device, except that a sampled row
# may pick another token whose reference score is within 1e-5 (relative) of the best one (Triton's
# log vs torch's may differ by an ulp on a near-tie). Greedy rows must match exactly, and at most
# 1% of the sampled rows may differ at all.
GUMBEL_SHAPES = (  # the fast tier: each row count and each vocabulary once
    tier([(n, v) for n in (1, 3, 64, 256) for v in (1000, 32000, 128256)],
         [(1, 1000), (3, 32000), (64, 128256), (256, 1000)]) if ON_CUDA
    else [(1, 1000), (3, 1000), (64, 1000), (256, 1000), (1, 32000), (3, 32000), (1, 128256)]
)


def _gumbel_scores(logits, temperature, seeds, positions):
    """The reference's per-token scores [N, V] float32 (plain logits on greedy rows)."""
    x = logits.float()
    u = ref.uniform_noise(seeds, positions, x.shape[-1])
    noisy = x / temperature.clamp_min(1e-5)[:, None] + (-torch.log(-torch.log(u)))
    return torch.where((temperature > 0)[:, None], noisy, x)


def _check_gumbel(out, logits, temperature, seeds, positions):
    expected = ref.gumbel_sample_reference(logits, temperature, seeds, positions)
    assert out.dtype == torch.int64 and out.shape == expected.shape
    greedy = temperature <= 0
    assert torch.equal(out[greedy], expected[greedy]), "greedy rows differ from argmax"
    differ = out != expected
    if differ.any():
        scores = _gumbel_scores(logits, temperature, seeds, positions)[differ]
        best = scores.max(-1).values
        chosen = scores.gather(1, out[differ][:, None]).squeeze(1)
        assert torch.isfinite(chosen).all(), "chose a -inf (masked) token"
        assert ((best - chosen) <= 1e-5 * best.abs().clamp_min(1.0)).all(), (out[differ], expected[differ])
        assert differ.sum().item() <= max(1, out.shape[0] // 100), f"{differ.sum().item()} rows differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,vocab", GUMBEL_SHAPES)
def test_gumbel_sample(dtype, n, vocab):
    from kernels.sampling import gumbel_sample_triton
    from tests.kernels.kernel_cases import gumbel_case

    logits, temperature, seeds, positions = gumbel_case(n, vocab, seed=n + vocab)
    args = (logits.to(dtype).to(DEVICE), temperature.to(DEVICE), seeds.to(DEVICE), positions.to(DEVICE))
    out = gumbel_sample_triton(*args)
    _check_gumbel(out, *args)
    assert torch.equal(gumbel_sample_triton(*args), out)  # deterministic


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,vocab", tier([(3, 1000), (64, 32001), (256, 128256)], [(3, 1000), (256, 128256)])
                         if ON_CUDA else [(3, 1000), (9, 3001)])
def test_gumbel_sample_under_a_token_bitmask(dtype, n, vocab):
    """The bit test inside the kernel (structured outputs): the reference on the masked logits."""
    from kernels.sampling import gumbel_sample_triton
    from tests.kernels.kernel_cases import bitmask_case, gumbel_case

    logits, temperature, seeds, positions = gumbel_case(n, vocab, seed=n + vocab)
    allowed, dense = bitmask_case(n, vocab, seed=n)
    masked = logits.to(dtype).masked_fill(~dense, float("-inf"))
    args = (temperature.to(DEVICE), seeds.to(DEVICE), positions.to(DEVICE))
    out = gumbel_sample_triton(logits.to(dtype).to(DEVICE), *args, allowed.to(DEVICE))
    _check_gumbel(out, masked.to(DEVICE), *args)
    possible = torch.isfinite(masked).any(-1).to(DEVICE)
    assert dense.to(DEVICE).gather(1, out[:, None]).squeeze(1)[possible].all()
    with pytest.raises(ValueError, match="allowed"):
        gumbel_sample_triton(logits.to(dtype).to(DEVICE), *args, allowed[:, :-1].to(DEVICE) if vocab > 32
                             else allowed[:1].to(DEVICE))


def test_gumbel_sample_row_strided_view_and_empty():
    from kernels.sampling import gumbel_sample_triton
    from tests.kernels.kernel_cases import gumbel_case

    logits, temperature, seeds, positions = gumbel_case(9, 5000, seed=11)
    wide = torch.full((9, 5100), 1e30).to(DEVICE)  # entries past V must never be read
    wide[:, :5000] = logits.to(DEVICE)
    args = (wide[:, :5000], temperature.to(DEVICE), seeds.to(DEVICE), positions.to(DEVICE))
    _check_gumbel(gumbel_sample_triton(*args), *args)
    empty = gumbel_sample_triton(args[0][:0], args[1][:0], args[2][:0], args[3][:0])
    assert empty.shape == (0,) and empty.dtype == torch.int64


def test_gumbel_sample_rejects_bad_arguments():
    from kernels.sampling import gumbel_sample_triton

    logits = torch.randn(4, 100, device=DEVICE)
    t, s, p = torch.ones(4, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="seeds"):
        gumbel_sample_triton(logits, t, s.int(), p)
    with pytest.raises(ValueError, match="logits"):
        gumbel_sample_triton(logits.half(), t, s, p)
    with pytest.raises(ValueError, match="temperature"):
        gumbel_sample_triton(logits, t[:3], s, p)


@pytest.mark.skipif(not ON_CUDA, reason="CUDA graphs need CUDA")
def test_gumbel_sample_cuda_graph_replay():
    import kernels
    from tests.kernels.kernel_cases import gumbel_case

    n, vocab = 64, 128256
    logits, temperature, seeds, positions = (t.to(DEVICE) for t in gumbel_case(n, vocab, seed=1))
    kernels.gumbel_sample(logits, temperature, seeds, positions)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.gumbel_sample(logits, temperature, seeds, positions)
    for seed in (2, 3):
        case = [t.to(DEVICE) for t in gumbel_case(n, vocab, seed=seed)]
        for static, new in zip((logits, temperature, seeds, positions), case):
            static.copy_(new)
        out.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        _check_gumbel(out, *case)
