"""The verify scan: its reference against a row-by-row loop written from the rule (CPU), and the
Triton kernel against the reference, exactly (CUDA, or TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference_verify import verify_scan_reference
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS

R = 40  # persistent rows (+ the scratch row of the executor's tables)


def _case(seed: int, num_rows: int, max_drafts: int, chain: bool, p_accept: float = 0.7):
    g = torch.Generator().manual_seed(seed)
    num_drafts = torch.randint(1, max_drafts + 1, (num_rows,), generator=g)
    starts = torch.cumsum(num_drafts, 0) - num_drafts
    d = int(num_drafts.sum())
    case = dict(
        accepted=torch.rand(d, generator=g) < p_accept, recovered=torch.randint(0, 1000, (d,), generator=g),
        draft_ids=torch.randint(0, 1000, (d,), generator=g), draft_start=starts, num_drafts=num_drafts,
        rows=torch.randperm(R, generator=g)[:num_rows], last_tokens=torch.randint(0, 1000, (R,), generator=g),
        chain_ok=torch.rand(R, generator=g) < 0.5,
        chained=(torch.rand(num_rows, generator=g) < 0.5) if chain else None,
        prev_last=torch.randint(0, 1000, (num_rows,), generator=g) if chain else None,
        max_drafts=max_drafts)
    return case


def _by_loop(c: dict):
    """The rule, one row at a time in Python."""
    last, ok = c["last_tokens"].tolist(), c["chain_ok"].tolist()
    tokens, counts, finals, valids = [], [], [], []
    for i, row in enumerate(c["rows"].tolist()):
        s, d = int(c["draft_start"][i]), int(c["num_drafts"][i])
        n = 0
        while n < d and bool(c["accepted"][s + n]):
            n += 1
        final = int(c["recovered"][s + n]) if n < d else last[row]
        toks = [int(x) for x in c["draft_ids"][s:s + n]] + [final]
        tokens.append(toks + [0] * (c["max_drafts"] + 1 - len(toks)))
        valid = True
        if c["chained"] is not None:
            valid = not bool(c["chained"][i]) or ok[row]
            if not valid:
                final = int(c["prev_last"][i])
        ok[row] = n == d and valid
        last[row] = final
        counts.append(n)
        finals.append(final)
        valids.append(valid)
    return tokens, counts, finals, valids, last, ok


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("seed,num_rows,max_drafts", [(0, 1, 1), (1, 1, 4), (2, 7, 4), (3, 33, 8), (4, 16, 15)])
def test_the_reference_follows_the_rule(seed, num_rows, max_drafts, chain):
    c = _case(seed, num_rows, max_drafts, chain)
    tokens, counts, finals, valids, last, ok = _by_loop(c)
    c_ref = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    t, n, f, v = verify_scan_reference(**c_ref)
    assert t.tolist() == tokens and n.tolist() == counts and f.tolist() == finals
    assert (v is None) == (not chain) and (v is None or v.tolist() == valids)
    assert c_ref["last_tokens"].tolist() == last and c_ref["chain_ok"].tolist() == ok


def test_every_draft_accepted_takes_the_bonus_and_any_rejection_the_recovered_token():
    c = _case(5, 3, 4, False, p_accept=1.0)
    bonus = c["last_tokens"][c["rows"]].clone()
    t, n, f, _ = verify_scan_reference(**c)
    assert torch.equal(n, c["num_drafts"]) and torch.equal(f, bonus) and bool(c["chain_ok"][c["rows"]].all())
    c = _case(6, 3, 4, False, p_accept=0.0)
    t, n, f, _ = verify_scan_reference(**c)
    assert n.tolist() == [0, 0, 0] and torch.equal(f, c["recovered"][c["draft_start"]])
    assert not bool(c["chain_ok"][c["rows"]].any())


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("seed,num_rows,max_drafts", [(0, 1, 1), (1, 1, 4), (2, 7, 4), (3, 33, 8), (4, 16, 15),
                                                      (5, 5, 20)])
@pytest.mark.parametrize("p_accept", [0.0, 0.7, 1.0])
@TRITON_MARKS[0]
@TRITON_MARKS[1]
def test_the_kernel_matches_the_reference(seed, num_rows, max_drafts, chain, p_accept):
    import kernels
    from kernels.spec_verify import verify_scan_triton

    c = _case(seed, num_rows, max_drafts, chain, p_accept)
    ref = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    dev = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    expected = verify_scan_reference(**ref)
    # what the executor calls (the dispatch, after the Triton module was imported: no name shadows it)
    got = (kernels.verify_scan if ON_CUDA else verify_scan_triton)(**dev)
    for e, x in zip(expected, got):
        assert (e is None) == (x is None)
        if e is not None:
            assert x.dtype == e.dtype and torch.equal(x.cpu(), e)
    assert torch.equal(dev["last_tokens"].cpu(), ref["last_tokens"])
    assert torch.equal(dev["chain_ok"].cpu(), ref["chain_ok"])


def test_no_kernel_module_shadows_a_kernel_function():
    """`from kernels.x import ...` sets kernels.x to the module: a kernel function named like a
    module of the package is replaced by it on the first CUDA call (it happened: verify_scan)."""
    from pathlib import Path

    import kernels

    folder = Path(kernels.__file__).parent
    assert [name for name in kernels.__all__ if (folder / f"{name}.py").exists()] == []
