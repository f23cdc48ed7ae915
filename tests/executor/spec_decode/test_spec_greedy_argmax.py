"""A greedy verify step samples its rows and scores its drafts with ONE argmax over the step's
logits rows (Sampler.take_argmax; the drafts' rows follow the sampled ones): the same tokens,
accepted and rejected drafts alike, as the general path (the sampler's draw, then the rejection
rule), which a step with a random row or drafts' logits from hidden states still takes."""

from __future__ import annotations

from unittest import mock

import pytest

from executor_svc.sample.sampler import Sampler
from tests.executor.conftest import make_runner
from tests.executor.spec_decode.test_spec_chain import accept_then_reject, greedy


@pytest.mark.parametrize("one_argmax", [True, False])
def test_a_greedy_verify_step_takes_one_argmax_and_the_general_paths_tokens(model_dirs, one_argmax):
    runner = make_runner(model_dirs["tiny-llama"], num_kv_blocks=32, block_size=16, max_num_seqs=8)
    taken = []
    take = runner.sampler.take_argmax

    def spy(ids, step):
        taken.append(len(ids))
        return take(ids, step)

    runner.sampler.take_argmax = spy
    ref = greedy(runner, 12)
    with mock.patch.object(Sampler, "greedy_only", staticmethod(lambda step: one_argmax)):
        accept_then_reject(runner, ref)
    assert taken == ([1, 1] if one_argmax else [])  # the two verify steps' one sampled row each


def test_greedy_only_is_a_plain_all_greedy_step_without_counts_or_logprobs():
    from executor_svc.sample.inputs import SampleStep

    assert Sampler.greedy_only(SampleStep(2, all_greedy=True, need_top_k_top_p=False))
    for other in (dict(all_greedy=False), dict(need_processors=True), dict(need_masks=True),
                  dict(need_penalties=True), dict(num_logprobs=0)):
        fields = dict(all_greedy=True, need_top_k_top_p=False) | other
        assert not Sampler.greedy_only(SampleStep(2, **fields)), other
