"""The verify tail's kernel (kernels.verify_token_rows): its reference against a request-by-request loop written from the rule (CPU), and
the Triton kernel against the reference, exactly (CUDA, or TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference_verify import verify_token_rows_reference
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS

R = 40  # persistent rows


def _case(seed: int, num_reqs: int, max_drafts: int, chain: bool, p_match: float, pad: int = 3):
    """A token-rows step: num_reqs requests of 1 + d tokens (d in 0..max_drafts), then `pad`
    padded rows (segment -2); each draft equals the token drawn before it with probability p_match."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randint(0, max_drafts + 1, (num_reqs,), generator=g)
    t = int((d + 1).sum()) + pad
    ids = torch.randint(0, 1000, (t,), generator=g)
    inputs = torch.randint(0, 1000, (t,), generator=g)
    segments = torch.full((t,), -2, dtype=torch.int32)
    chained = (torch.rand(num_reqs, generator=g) < 0.5) if chain else torch.zeros(num_reqs, dtype=torch.bool)
    rows = torch.randperm(R, generator=g)[:num_reqs]
    src = torch.randint(0, R, (t,), generator=g)  # padded rows: any row (never read)
    s = 0
    for i in range(num_reqs):
        n = int(d[i])
        segments[s] = (n << 1) | int(chained[i])
        segments[s + 1:s + n + 1] = -1
        src[s:s + n + 1] = rows[i]
        match = torch.rand(n, generator=g) < p_match
        inputs[s + 1:s + n + 1] = torch.where(match, ids[s:s + n], inputs[s + 1:s + n + 1])
        s += n + 1
    return dict(ids=ids, input_ids=inputs, segments=segments, src_rows=src,
                last_tokens=torch.randint(0, 1000, (R,), generator=g), chain_ok=torch.rand(R, generator=g) < 0.5,
                counts=torch.full((t,), 7, dtype=torch.int64))


def _by_loop(c: dict) -> tuple[list[int], list[int], list[bool], list[list[int]]]:
    """The rule, one request at a time in Python: (counts, last tokens, chain flags, each valid
    request's tokens)."""
    ids, inputs, seg = c["ids"].tolist(), c["input_ids"].tolist(), c["segments"].tolist()
    last, ok, counts, tokens = c["last_tokens"].tolist(), c["chain_ok"].tolist(), [0] * len(ids), []
    for s, v in enumerate(seg):
        if v < 0:
            continue
        d, row = v >> 1, int(c["src_rows"][s])
        n = 0
        while n < d and ids[s + n] == inputs[s + n + 1]:
            n += 1
        valid = not (v & 1) or ok[row]
        ok[row] = valid and n == d
        if valid:
            last[row] = ids[s + n]
            tokens.append(inputs[s + 1:s + n + 1] + [ids[s + n]])  # the accepted drafts, then the token there
        counts[s] = n + 1 if valid else 0
    return counts, last, ok, tokens


def _tokens(c: dict) -> list[list[int]]:
    """Each valid request's tokens as the host reads them: ids[s : s + counts[s]]."""
    ids, counts = c["ids"].tolist(), c["counts"].tolist()
    return [ids[s:s + counts[s]] for s, v in enumerate(c["segments"].tolist()) if v >= 0 and counts[s]]


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("seed,num_reqs,max_drafts", [(0, 1, 0), (1, 1, 4), (2, 7, 4), (3, 33, 8), (4, 16, 15)])
@pytest.mark.parametrize("p_match", [0.0, 0.8, 1.0])
def test_the_reference_is_the_rule(seed, num_reqs, max_drafts, chain, p_match):
    c = _case(seed, num_reqs, max_drafts, chain, p_match)
    counts, last, ok, tokens = _by_loop(c)
    verify_token_rows_reference(**c)
    assert c["counts"].tolist() == counts
    assert c["last_tokens"].tolist() == last
    assert c["chain_ok"].tolist() == ok
    assert _tokens(c) == tokens


def test_a_request_emits_its_accepted_drafts_then_the_argmax_at_the_first_mismatch():
    # one request: token row 0 (input: the last token) then drafts 11, 12, 99 at rows 1..3
    ids = torch.tensor([11, 12, 13, 14])  # argmax at each row: drafts 11, 12 match, 99 != 13
    c = dict(ids=ids, input_ids=torch.tensor([0, 11, 12, 99]), segments=torch.tensor([3 << 1, -1, -1, -1],
             dtype=torch.int32), src_rows=torch.tensor([5, 5, 5, 5]), last_tokens=torch.zeros(8, dtype=torch.int64),
             chain_ok=torch.ones(8, dtype=torch.bool), counts=torch.zeros(4, dtype=torch.int64))
    verify_token_rows_reference(**c)
    assert c["counts"].tolist() == [3, 0, 0, 0]  # tokens ids[0:3] = 11, 12, then 13 in place of 99
    assert int(c["last_tokens"][5]) == 13 and not bool(c["chain_ok"][5])


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("seed,num_reqs,max_drafts", [(0, 1, 0), (1, 1, 4), (2, 7, 4), (3, 33, 8), (4, 16, 15)])
@pytest.mark.parametrize("p_match", [0.0, 0.8, 1.0])
@TRITON_MARKS[0]
@TRITON_MARKS[1]
def test_the_kernel_matches_the_reference(seed, num_reqs, max_drafts, chain, p_match):
    import kernels
    from kernels.spec_verify import verify_token_rows_triton

    c = _case(seed, num_reqs, max_drafts, chain, p_match)
    ref = {k: v.clone() for k, v in c.items()}
    dev = {k: v.to(DEVICE) for k, v in c.items()}
    verify_token_rows_reference(**ref)
    (kernels.verify_token_rows if ON_CUDA else verify_token_rows_triton)(**dev)
    for k in ("counts", "last_tokens", "chain_ok", "ids"):
        assert torch.equal(dev[k].cpu(), ref[k]), k
