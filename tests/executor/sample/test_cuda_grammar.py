"""Structured outputs on a GPU: the grammar tests of test_grammar_rows.py and
test_deferred_sampling.py on a CUDA runner with its decode graphs captured (a step with a
constrained row samples eagerly, after the graph's forward, enqueued by the next launch or its
own finish; masks are copied from pinned memory non-blocking and tested inside the sampling
kernel). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.executor.sample.test_deferred_sampling import (  # noqa: F401 (collected here with this runner)
    test_an_unconstrained_step_samples_in_its_launch,
    test_the_executors_pipeline_gives_the_tokens_of_one_step_at_a_time,
    test_the_next_launch_enqueues_it_and_the_last_steps_finish_does,
)
from tests.executor.sample.test_grammar_rows import (  # noqa: F401 (collected here with this runner)
    test_a_choice_is_one_of_the_choices,
    test_a_grammar_that_cannot_be_used_fails_its_request_alone,
    test_a_preempted_request_resumes_its_grammar,
    test_a_row_given_to_another_request_mid_pipeline_does_not_consume_the_old_token,
    test_drafts_on_a_grammar_row_are_refused_and_fail_it_alone,
    test_greedy_under_a_grammar_it_satisfies_equals_greedy_without,
    test_sampled_tokens_follow_a_regex,
    test_unconstrained_rows_beside_constrained_ones_are_untouched,
    tokenizer,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def runner(model_dirs):
    from tests.executor.cuda_helpers import cuda_runner

    return cuda_runner(model_dirs["tiny-llama"], dtype="float32", max_num_seqs=8,
                       cuda_graph_sizes=(1, 2, 4, 8), num_kv_blocks=256)
