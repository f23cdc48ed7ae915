"""The fused rejection rule (kernels/spec_reject.py) against its reference
(kernels/reference_reject.py), on CUDA or under TRITON_INTERPRET=1: the recovered tokens exactly,
the accept decisions exactly but where the acceptance uniform is within 1e-5 of p(draft) (the
kernel's exponential is approximate). The rule's distribution is tested on CPU through the
verifier (tests/executor/spec_decode/test_spec_verify.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import uniform_noise
from kernels.reference_reject import rejection_sample_reference
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS

KEY = 0x5EC_DEC0DE


def _case(seed: int, rows: int, vocab: int, dtype: torch.dtype):
    """Logits with a few peaked rows; drafts: the argmax (a third), draws from p (a third) and
    random tokens; temperatures greedy, 0.7, 1.0 and 1.6 in turn; seeds over the whole int64 range."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=g) * torch.linspace(0.5, 6.0, rows)[:, None]).to(dtype)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.6] * rows)[:rows]
    probs = (logits.float() / temperature.clamp_min(1e-5)[:, None]).softmax(-1)
    drafts = torch.randint(0, vocab, (rows,), generator=g)
    drafts[0::3] = logits.float()[0::3].argmax(-1)
    drafts[1::3] = torch.multinomial(probs[1::3], 1, generator=g)[:, 0]
    drafts[4::5] = -1  # no draft: the row's plain draw (a request's last token row in a verify tail)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=g)
    positions = torch.randint(0, 1 << 20, (rows,), generator=g)
    return logits, drafts, temperature, seeds, positions


@TRITON_MARKS[0]
@TRITON_MARKS[1]
@pytest.mark.parametrize("rows,vocab", [(1, 1000), (37, 5003), (64, 32000)] if ON_CUDA else [(1, 1000), (37, 5003)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if ON_CUDA else [torch.float32])
def test_the_kernel_matches_the_reference(rows, vocab, dtype):
    from kernels.spec_reject import rejection_sample_triton

    case = _case(rows + vocab, rows, vocab, dtype)
    want_acc, want_rec = rejection_sample_reference(*(t.to(DEVICE) for t in case), KEY)
    got_acc, got_rec = rejection_sample_triton(*(t.to(DEVICE) for t in case), KEY)
    assert got_acc.dtype == torch.bool and got_rec.dtype == torch.int64
    assert torch.equal(got_rec.cpu(), want_rec.cpu())
    logits, drafts, temperature, seeds, positions = case
    scaled = logits.float() / temperature.clamp_min(1e-5)[:, None]
    p_draft = scaled.softmax(-1).gather(1, drafts.clamp_min(0)[:, None])[:, 0]
    u = uniform_noise(seeds ^ KEY, positions, 1)[:, 0]
    close = (temperature > 0) & ((u - p_draft).abs() <= 1e-5)
    differ = got_acc.cpu() != want_acc.cpu()
    assert not (differ & ~close).any(), differ.nonzero()
    assert 0 < int(want_acc.sum()) < rows or rows == 1  # both outcomes occur
    assert not got_acc.cpu()[drafts < 0].any()


def test_a_row_without_a_draft_is_not_accepted_and_draws_as_the_sampler():
    """Draft -1: the rule's token is the sampler's plain draw (gumbel_sample), bit for bit, on
    greedy and random rows; rows with a draft are unchanged by the others having none."""
    from kernels.reference import gumbel_sample_reference

    logits, drafts, temperature, seeds, positions = _case(3, 24, 2000, torch.float32)
    none = torch.full_like(drafts, -1)
    accepted, recovered = rejection_sample_reference(logits, none, temperature, seeds, positions, KEY)
    assert not accepted.any()
    assert torch.equal(recovered, gumbel_sample_reference(logits, temperature, seeds, positions))
    mixed = torch.where(torch.arange(24) % 2 == 0, drafts, none)
    acc_m, rec_m = rejection_sample_reference(logits, mixed, temperature, seeds, positions, KEY)
    acc_d, rec_d = rejection_sample_reference(logits, drafts, temperature, seeds, positions, KEY)
    assert torch.equal(acc_m[0::2], acc_d[0::2]) and torch.equal(rec_m[0::2], rec_d[0::2])
    assert torch.equal(rec_m[1::2], recovered[1::2])


@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA (the sampling kernel's loop does not run interpreted)")
def test_without_a_draft_the_kernel_draws_the_sampling_kernels_token():
    """On the device, the rule's plain draw equals kernels.gumbel_sample's token exactly: a verify
    tail's bonus token is the one the scan path's sampler draws (same kernels, same noise)."""
    from kernels.sampling import gumbel_sample_triton
    from kernels.spec_reject import rejection_sample_triton

    logits, _, temperature, seeds, positions = (t.to(DEVICE) for t in _case(5, 40, 32000, torch.float32))
    none = torch.full((40,), -1, dtype=torch.int64, device=DEVICE)
    accepted, recovered = rejection_sample_triton(logits, none, temperature, seeds, positions, KEY)
    assert not accepted.any()
    assert torch.equal(recovered, gumbel_sample_triton(logits, temperature, seeds, positions))


@TRITON_MARKS[0]
@TRITON_MARKS[1]
def test_the_kernel_checks_its_inputs_and_takes_no_rows():
    from kernels.spec_reject import rejection_sample_triton

    logits, drafts, temperature, seeds, positions = (t.to(DEVICE) for t in _case(0, 4, 1000, torch.float32))
    with pytest.raises(ValueError, match="draft_ids has 3 entries"):
        rejection_sample_triton(logits, drafts[:3], temperature, seeds, positions, KEY)
    with pytest.raises(Exception, match="temperature"):
        rejection_sample_triton(logits, drafts, temperature.double(), seeds, positions, KEY)
    acc, rec = rejection_sample_triton(logits[:0], drafts[:0], temperature[:0], seeds[:0], positions[:0], KEY)
    assert acc.shape == rec.shape == (0,)
