"""A greedy verify step samples its rows and scores its drafts in one pass: laid out as token
rows, the greedy tail (spec_decode/verify_tail.py: one argmax and one scan kernel); otherwise ONE
argmax over the step's logits rows (Sampler.take_argmax; the drafts' rows follow the sampled
ones). Both give the same tokens, accepted and rejected drafts alike, as the general path (the
sampler's draw, then the rejection rule), which a step with a random row still takes."""

from __future__ import annotations

from unittest import mock

import pytest

from executor_svc.sample.sampler import Sampler
from tests.executor.conftest import make_runner
from tests.executor.spec_decode.test_spec_chain import accept_then_reject, greedy


@pytest.mark.parametrize("path", ["greedy tail", "one argmax", "general"])
def test_a_greedy_verify_step_takes_one_pass_and_the_general_paths_tokens(model_dirs, path):
    """Three paths, the same tokens: a token-rows step's greedy tail (verify_tail.py), a step
    not laid out as token rows (one argmax over its logits rows), and the general path."""
    runner = make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16, max_num_seqs=8)
    taken, tails = [], []
    take, tail = runner.sampler.take_argmax, runner.verifier.run_tail

    def spy(ids, step):
        taken.append(len(ids))
        return take(ids, step)

    def spy_tail(v, logits, num_tokens, graph_size):
        tails.append((num_tokens, v.tail))
        return tail(v, logits, num_tokens, graph_size)

    runner.sampler.take_argmax, runner.verifier.run_tail = spy, spy_tail
    ref = greedy(runner, 12)
    with mock.patch.object(Sampler, "greedy_only", staticmethod(lambda step: path != "general")), \
            mock.patch("executor_svc.worker.model_runner.use_token_rows",
                       side_effect=lambda sched, rows: path == "greedy tail"):
        accept_then_reject(runner, ref)
    assert taken == ([1, 1] if path == "one argmax" else [])  # the two verify steps' one sampled row each
    assert tails == ([(4, "greedy")] * 2 if path == "greedy tail" else [])  # their 1 + 3 token rows


def test_greedy_only_is_a_plain_all_greedy_step_without_counts_or_logprobs():
    from executor_svc.sample.inputs import SampleStep

    assert Sampler.greedy_only(SampleStep(2, all_greedy=True, need_top_k_top_p=False))
    for other in (dict(all_greedy=False), dict(need_processors=True), dict(need_masks=True),
                  dict(need_penalties=True), dict(num_logprobs=0)):
        fields = dict(all_greedy=True, need_top_k_top_p=False) | other
        assert not Sampler.greedy_only(SampleStep(2, **fields)), other
