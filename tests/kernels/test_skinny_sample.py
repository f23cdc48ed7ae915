"""Final norm + lm_head + Gumbel-max sampling in one pass (kernels/skinny_sample.py): the reference
is the three references in sequence and the CPU dispatch is it (always run); the Triton kernel
(CUDA, or CPU under TRITON_INTERPRET=1 in fp16/fp32 and small shapes) draws exactly the ids of the
unfused Triton pipeline (rms_norm_linear_triton with the same config, then gumbel_sample_triton on
its logits) and writes exactly its logits when asked; greedy and seeded rows, token bitmasks, an
all-forbidden row, the residual/norm variants, the last-token store, dependent launches (ids
unchanged) and the refusals."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, bitmask_case, gumbel_case

EPS = 1e-5
DTYPE = torch.bfloat16 if ON_CUDA else torch.float16  # the interpreter's tl.dot mishandles bf16
K = 2048 if ON_CUDA else 96  # interpreted: two K tiles of 64, the second partial
VOCABS = [1000, 4099] + ([128256] if ON_CUDA else [])


def triton_test(fn):
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def _case(m, vocab, dtype, seed=0):
    """(x, residual, norm_weight, w, temperature, seeds, positions) on DEVICE: mixed greedy and
    seeded rows (tests/kernels/kernel_cases.gumbel_case's parameters)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=gen).to(dtype)
    r = torch.randn(m, K, generator=gen).to(dtype)
    nw = (torch.randn(K, generator=gen) * 0.2 + 1.0).to(dtype)
    w = (torch.randn(vocab, K, generator=gen) * 0.05).to(dtype)
    _, temperature, seeds, positions = gumbel_case(m, 8, seed)
    return [t.to(DEVICE) for t in (x, r, nw, w, temperature, seeds, positions)]


def _configs(m):
    from kernels.skinny_tune import SkinnyConfig

    if m == 1:
        return [SkinnyConfig(16, 64, 4, 1, 1), SkinnyConfig(8, 64, 4, 1, 1)]
    return [SkinnyConfig(32, 64, 4, 1, 1), SkinnyConfig(8, 64, 4, 1, 1, False)]


# --- reference and CPU dispatch: always run -----------------------------------------------------

@pytest.mark.parametrize("variant", ["residual", "norm", "normed"])
def test_reference_is_the_three_references_and_the_cpu_dispatch(variant):
    x, r, nw, w, t, s, p = (v.cpu().float() if v.is_floating_point() else v.cpu() for v in _case(5, 300, DTYPE))
    t = t.float()
    residual = r if variant == "residual" else None
    norm_weight = None if variant == "normed" else nw
    allowed = bitmask_case(5, 300, seed=3)[0]
    if norm_weight is None:
        h = x
    elif residual is None:
        h = ref.rms_norm_reference(x, nw, EPS)
    else:
        h = ref.rms_norm_reference(x, nw, EPS, residual)[0]
    logits = ref.skinny_linear_reference(h, w)
    want = ref.gumbel_sample_reference(logits, t, s, p, allowed)
    ids, got_logits = ref.rms_norm_lm_head_sample_reference(x, residual, norm_weight, EPS, w, t, s, p, allowed)
    assert torch.equal(got_logits, logits) and torch.equal(ids, want)
    last = torch.full((9,), -1, dtype=torch.int64)
    rows = torch.tensor([8, 0, 3, 5, 1])
    assert torch.equal(kernels.rms_norm_lm_head_sample(x, residual, norm_weight, EPS, w, t, s, p, allowed,
                                                       rows=rows, last_tokens=last), want)
    assert torch.equal(last[rows], want) and (last[[2, 4, 6, 7]] == -1).all()


# --- the Triton kernel --------------------------------------------------------------------------

def _unfused(x, residual, nw, w, t, s, p, allowed, cfg):
    from kernels.sampling import gumbel_sample_triton
    from kernels.skinny_gemm import rms_norm_linear_triton, skinny_linear_triton

    if nw is None:
        logits = skinny_linear_triton(x, w, config=cfg)
    else:
        logits = rms_norm_linear_triton(x, residual, nw, EPS, w, config=cfg)[0]
    scores = logits.float() if logits.dtype == torch.float16 else logits  # (fp16 -> fp32: exact)
    return gumbel_sample_triton(scores, t, s, p, allowed), logits


@triton_test
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("variant", ["residual", "norm", "normed"])
@pytest.mark.parametrize("masked", [False, True])
def test_kernel_draws_the_unfused_pipelines_ids(m, vocab, variant, masked):
    from kernels.skinny_sample import rms_norm_lm_head_sample_triton

    x, r, nw, w, t, s, p = _case(m, vocab, DTYPE, seed=m + vocab)
    residual = r if variant == "residual" else None
    nw = None if variant == "normed" else nw
    allowed = bitmask_case(m, vocab, seed=m)[0].to(DEVICE) if masked else None
    for cfg in _configs(m):
        want, want_logits = _unfused(x, residual, nw, w, t, s, p, allowed, cfg)
        logits = torch.full((m, vocab), float("nan"), dtype=DTYPE, device=DEVICE)
        last = torch.full((m + 2,), -1, dtype=torch.int64, device=DEVICE)
        rows = torch.arange(m, 0, -1, device=DEVICE)  # row i -> m - i
        got = rms_norm_lm_head_sample_triton(x, residual, nw, EPS, w, t, s, p, allowed, logits_out=logits,
                                             rows=rows, last_tokens=last, config=cfg)
        assert torch.equal(got, want), cfg
        assert torch.equal(logits.view(torch.int16), want_logits.view(torch.int16)), cfg
        assert torch.equal(last[rows], want) and last[0] == -1 and last[m + 1] == -1
        alone = rms_norm_lm_head_sample_triton(x, residual, nw, EPS, w, t, s, p, allowed, config=cfg)
        assert torch.equal(alone, want), cfg


@triton_test
def test_kernel_against_the_reference_in_fp32():
    from kernels.skinny_sample import rms_norm_lm_head_sample_triton

    x, r, nw, w, t, s, p = (v.float() if v.is_floating_point() and v.dtype != torch.float32 else v
                            for v in _case(4, 777, DTYPE, seed=9))
    ids = rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p)
    want, logits = ref.rms_norm_lm_head_sample_reference(x, r, nw, EPS, w, t, s, p)
    # a differing id must be a near-tie of the reference's scores (fp32 sums in another order)
    scaled = torch.where(t[:, None] > 0, logits / t.clamp_min(1e-5)[:, None], logits)
    noise = -torch.log(-torch.log(ref.uniform_noise(s, p, 777)))
    score = torch.where(t[:, None] > 0, scaled + noise, logits)
    rows = torch.arange(4, device=ids.device)
    assert (score[rows, ids] >= score.max(dim=1).values - 1e-4 * score.abs().max()).all()
    assert (ids == want).float().mean() >= 0.75


@triton_test
def test_all_forbidden_row_takes_token_zero_and_refusals():
    from kernels.skinny_sample import rms_norm_lm_head_sample_triton
    from kernels.skinny_tune import SkinnyConfig

    x, r, nw, w, t, s, p = _case(2, 300, DTYPE)
    allowed = torch.zeros(2, 10, dtype=torch.int32, device=DEVICE)
    allowed[1, 3] = 1 << 4  # only token 100
    assert rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, allowed).tolist() == [0, 100]
    with pytest.raises(ValueError, match="split_k"):
        rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, config=SkinnyConfig(16, 64, 4, 1, 2))
    with pytest.raises(ValueError, match="temperature"):
        rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t[:1], s, p)
    with pytest.raises(ValueError, match="rows and last_tokens"):
        rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, rows=torch.zeros(2, dtype=torch.int64,
                                                                                    device=DEVICE))
    with pytest.raises(ValueError, match="logits_out"):
        rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, logits_out=torch.empty(2, 299, dtype=DTYPE,
                                                                                          device=DEVICE))
    with pytest.raises(ValueError, match="allowed"):
        rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, allowed[:, :9])
    with pytest.raises(ValueError, match="rows"):
        rms_norm_lm_head_sample_triton(torch.cat([x] * 9), None, nw, EPS, w, t.repeat(9), s.repeat(9), p.repeat(9))


@pytest.mark.cuda
@pytest.mark.skipif(not (ON_CUDA and torch.cuda.get_device_capability()[0] >= 9),
                    reason="needs CUDA, compute capability 9.0+")
def test_dependent_launch_gives_the_same_ids_and_greedy_is_the_logits_argmax():
    from kernels.skinny_sample import rms_norm_lm_head_sample_triton

    x, r, nw, w, t, s, p = _case(1, 128256, DTYPE, seed=4)
    assert torch.equal(rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p),
                       rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, t, s, p, pdl=True))
    greedy = torch.zeros_like(t)
    logits = torch.empty(1, 128256, dtype=DTYPE, device=DEVICE)
    ids = rms_norm_lm_head_sample_triton(x, r, nw, EPS, w, greedy, s, p, logits_out=logits, pdl=True)
    assert ids.item() == int(logits.float().argmax())
