"""The top alternatives of a row's logprobs (sample/logits_processors.py, top_k): ties at equal
logprobs come in index order, and a row's top-k is the same whether k alternatives are asked
or more are computed and sliced (the logprobs graphs compute max_logprobs; an eager step its
own k). bf16 logits tie often: this broke issue 28's determinism through the services."""

from __future__ import annotations

import torch

from executor_svc.sample.logits_processors import compute_logprobs, top_k


def _tied_logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 4000, generator=g).to(torch.bfloat16)  # bf16: many equal values
    logits[0, [7, 900, 3, 2500]] = 9.0  # four-way tie for the best
    logits[1, [50, 40]] = 6.0  # the best, then a tie at the second place
    logits[1, [3000, 10, 1999]] = 5.0
    return logits


def test_ties_come_in_index_order():
    ids, values = top_k(torch.log_softmax(_tied_logits().float(), dim=-1), 6)
    assert ids[0, :4].tolist() == [3, 7, 900, 2500]
    assert ids[1, :5].tolist() == [40, 50, 10, 1999, 3000]
    for row_ids, row_values in zip(ids.tolist(), values.tolist()):
        assert all(a > b or (a == b and i < j) for (a, i), (b, j) in
                   zip(zip(row_values, row_ids), zip(row_values[1:], row_ids[1:])))


def test_a_rows_top_k_does_not_depend_on_k():
    logits = _tied_logits()
    chosen = logits.float().argmax(dim=-1)
    wide = compute_logprobs(logits, chosen, 20)
    for k in (1, 2, 3, 5):
        narrow = compute_logprobs(logits, chosen, k)
        assert torch.equal(narrow.top_ids, wide.top_ids[:, :k]), k
        assert torch.equal(narrow.top_logprobs, wide.top_logprobs[:, :k]), k
        assert torch.equal(narrow.logprobs, wide.logprobs) and torch.equal(narrow.ranks, wide.ranks)
    assert compute_logprobs(logits, chosen, 0).top_ids.shape == (8, 0)
