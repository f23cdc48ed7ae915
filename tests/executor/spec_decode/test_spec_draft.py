"""The executor's side of draft-model speculation: its flag, and the plan checks of an
executor with a draft model (counts without ids) and without one (ids required)."""

from __future__ import annotations

import pytest

from executor_svc.config import ExecutorConfig
from executor_svc.worker.plan_checks import PlanError
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, make_runner


def test_the_flag_reads_the_draft_model_only():
    def parse(text):
        c = ExecutorConfig.from_args(["--device", "cpu", "--speculative-config", text])
        return c.speculative_model, c.num_speculative_tokens

    assert parse('{"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}') == ("/d", 3)
    assert parse('{"model": "/d", "num_speculative_tokens": 2}') == ("/d", 2)  # method inferred
    assert parse('{"method": "ngram", "num_speculative_tokens": 4}') == ("", 0)  # the scheduler's
    assert parse("") == ("", 0)
    for bad in ('{"model": "/d"}', '{"method": "draft_model", "num_speculative_tokens": 2}',
                '{"model": "/d", "num_speculative_tokens": true}', "[1]", "draft"):
        with pytest.raises(SystemExit):
            parse(bad)


def test_plan_checks_follow_who_proposes(model_dirs):
    path = model_dirs["tiny-llama"]
    with_draft = make_runner(path, num_kv_blocks=32, block_size=16, speculative_model=str(path),
                             num_speculative_tokens=2)
    plain = make_runner(path, num_kv_blocks=32, block_size=16)
    assert with_draft.info().draft_model_path == str(path) and not plain.info().draft_model_path
    for runner in (with_draft, plain):
        runner.execute(StepPlan(0, new_requests=[NewRequestData(1, [5, 6, 7, 8], SamplerParams(), [1], 0, 4)]))
    with pytest.raises(PlanError, match="draft_token_ids sent to an executor with a draft model"):
        with_draft.launch(StepPlan(1, cached_requests=cached_rows((1, 3)), num_draft_tokens=[2],
                                   draft_token_ids=[5, 6]))
    with pytest.raises(PlanError, match="do not match 0 draft_token_ids"):
        plain.launch(StepPlan(1, cached_requests=cached_rows((1, 3)), num_draft_tokens=[2]))
    result = with_draft.execute(StepPlan(1, cached_requests=cached_rows((1, 2)), num_draft_tokens=[2]))
    assert result.failed_req_ids == [1] and "need a decode row of 3 tokens" in result.failed_errors[0]
    assert not with_draft.batch.requests  # a row's fault: it alone fails and is forgotten
    with_draft.execute(StepPlan(0, new_requests=[NewRequestData(1, [5, 6, 7, 8], SamplerParams(), [1], 0, 4)]))
    # the same verify row, its drafts from the draft model (the target itself: all accepted)
    result = with_draft.execute(StepPlan(1, cached_requests=cached_rows((1, 3)), num_draft_tokens=[2]))
    reference = plain.execute(StepPlan(1, cached_requests=cached_rows((1, 1))))
    assert result.req_ids == [1] and result.num_tokens == [3]
    assert result.token_ids[0] == reference.token_ids[0]
