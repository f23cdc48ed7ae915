"""Every bad field of a step plan is refused by name. A fault of the whole plan raises
PlanError and changes nothing: rows, block tables, last samples and KV stay as they were. A
fault of one row fails that row alone (StepResult.failed_req_ids): nothing of a new row is
applied, a cached row is forgotten, and the other rows run. The next good plan gives the
tokens it would have given without the bad ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from executor_svc.worker.plan_checks import PlanError
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, hf_greedy, make_runner

GREEDY = SamplerParams()
PROMPT_A = list(range(3, 40))  # 37 tokens, request 1: prefilled, then decodes
PROMPT_B = [7, 99, 12, 300, 41, 5, 6, 8, 250, 11]  # 10 tokens, request 2: 6 prefilled so far
# The runner of make_runner: vocab 512, 128 KV blocks of 16, max_model_len 512 (32 blocks per
# request), max_num_seqs 8, max_num_batched_tokens 256.


def new(req_id=3, tokens=PROMPT_B, params=GREEDY, blocks=(9, 10), computed=0, n=None) -> NewRequestData:
    return NewRequestData(req_id, list(tokens), params, list(blocks), computed,
                          len(tokens) - computed if n is None else n)


def plan(new_requests=(), cached: CachedRequestData | None = None, finished=(), preempted=()) -> StepPlan:
    return StepPlan(0, list(new_requests), cached or CachedRequestData(), list(finished), list(preempted))


# Faults of the whole plan: (bad plan, what the error must name). Refused with PlanError,
# nothing applied.
PLAN_ERRORS = {
    "cached id twice": (plan(cached=decode_rows([1, 1])), "request 1 is scheduled twice"),
    "new and cached": (plan([new(req_id=1, blocks=(9,))], decode_rows([1])), "request 1 is scheduled twice"),
    "new id running": (plan([new(req_id=1, blocks=(9,))]), "new request 1 is already running"),
    "cached and finished": (plan(cached=decode_rows([1]), finished=[1]), "cached request 1 is also finished"),
    "too many tokens": (plan([new(tokens=[5] * 300, blocks=range(9, 29))]), "300 scheduled tokens > max_num_batched_tokens 256"),
    "too many rows": (plan([new(req_id=10 + i, blocks=(20 + i,)) for i in range(9)]), "9 scheduled requests > max_num_seqs 8"),
    "too many running": (plan([new(req_id=10 + i, blocks=(20 + i,)) for i in range(7)]), "9 running requests"),
    "ragged columns": (plan(cached=CachedRequestData([1], [1, 1], [0], [])), "cached_requests: 1 req_ids, 2"),
    "blocks do not add up": (plan(cached=CachedRequestData([1], [1], [1], [])), "num_new_blocks add up to 1"),
}
# Faults of new request 3 alone: (bad plan, what its error must name). The rest of the plan
# runs (here: nothing else), and nothing of request 3 is applied.
NEW_ROW_ERRORS = {
    "null block": (plan([new(blocks=(0, 9))]), "block id 0 is outside 1 to 127"),
    "block past the cache": (plan([new(blocks=(9, 128))]), "block id 128"),
    "negative block": (plan([new(blocks=(-1,))]), "block id -1"),
    "temperature nan": (plan([new(params=SamplerParams(temperature=math.nan))]), "temperature nan"),
    "temperature inf": (plan([new(params=SamplerParams(temperature=math.inf))]), "temperature inf"),
    "temperature < 0": (plan([new(params=SamplerParams(temperature=-1.0))]), "temperature -1.0"),
    "top_p 0": (plan([new(params=SamplerParams(top_p=0.0))]), "top_p 0.0"),
    "top_p > 1": (plan([new(params=SamplerParams(top_p=1.5))]), "top_p 1.5"),
    "top_p nan": (plan([new(params=SamplerParams(top_p=math.nan))]), "top_p nan"),
    "top_k < 0": (plan([new(params=SamplerParams(top_k=-1))]), "top_k -1"),
    "presence nan": (plan([new(params=SamplerParams(presence_penalty=math.nan))]), "presence_penalty nan"),
    "frequency inf": (plan([new(params=SamplerParams(frequency_penalty=math.inf))]), "frequency_penalty inf"),
    "repetition 0": (plan([new(params=SamplerParams(repetition_penalty=0.0))]), "repetition_penalty 0.0"),
    "min_p > 1": (plan([new(params=SamplerParams(min_p=1.5))]), "min_p 1.5"),
    "bias id past vocab": (plan([new(params=SamplerParams(logit_bias=((512, 1.0),)))]), "logit_bias token ids"),
    "bias id twice": (plan([new(params=SamplerParams(logit_bias=((5, 1.0), (5, 2.0))))]), "logit_bias token ids"),
    "bias nan": (plan([new(params=SamplerParams(logit_bias=((5, math.nan),)))]), "logit_bias value"),
    "too many biases": (plan([new(params=SamplerParams(logit_bias=tuple((i, 1.0) for i in range(301))))]),
                        "logit_bias entries: 301 > 300"),
    "stop id past vocab": (plan([new(params=SamplerParams(min_tokens=2, min_tokens_stop_ids=(600,)))]),
                           "min_tokens_stop_ids outside"),
    "logprobs > max": (plan([new(params=SamplerParams(logprobs=21))]), "logprobs 21"),
    "prompt_logprobs < -1": (plan([new(params=SamplerParams(prompt_logprobs=-2))]), "prompt_logprobs -2"),
    "prompt longer than tokens": (plan([NewRequestData(3, PROMPT_B, GREEDY, [9, 10], 0, 10, num_prompt_tokens=11)]),
                                  "num_prompt_tokens 11"),
    "token past vocab": (plan([new(tokens=[5, 512, 6])]), "token id 512 is outside the vocabulary"),
    "negative token": (plan([new(tokens=[-5, 6])]), "token id -5"),
    "no tokens": (plan([new(tokens=[], n=1)]), "0 token_ids"),
    "prompt past max_model_len": (plan([new(tokens=[5] * 513, n=16, blocks=range(9, 41))]), "513 token_ids"),
    "new 0 tokens": (plan([new(n=0)]), "new request 3: num_scheduled_tokens is 0"),
    "new past its tokens": (plan([new(n=11)]), "go past its 10 token_ids"),
    "new computed past tokens": (plan([new(computed=10, n=1)]), "go past its 10 token_ids"),
    "tokens past blocks": (plan([new(tokens=PROMPT_A, blocks=(9,))]), "37 tokens do not fit in its 1 blocks"),
    "too many blocks": (plan([new(blocks=range(9, 42))]), "33 block_ids > 32 per request"),
}
# Faults of one cached row: (bad plan, the failed request, what its error must name, the
# requests that still sample and the index of their token in their greedy continuation).
# The failed row is forgotten; the others run as without it.
CACHED_ROW_ERRORS = {
    "cached new block": (plan([new()], cached_rows((1, 1, [500]))), 1, "cached request 1: block id 500", {3: 0}),
    "unknown cached id": (plan(cached=decode_rows([1, 42]), finished=[2]), 42, "cached request 42 is not running",
                          {1: 3}),
    "cached 0 tokens": (plan(cached=cached_rows((1, 0), (2, 4))), 1, "cached request 1: num_scheduled_tokens is 0",
                        {2: 0}),
    "cached chunk past known": (plan(cached=cached_rows((1, 1), (2, 5))), 2, "cached request 2: num_scheduled_tokens 5",
                                {1: 3}),
    "decode of 2 tokens": (plan(cached=cached_rows((1, 2))), 1, "cached request 1: num_scheduled_tokens 2", {}),
}


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"])


def _state(runner) -> dict:
    b = runner.batch
    arrays = {name: getattr(b, name).copy() for name in ("block_table", "num_blocks", "num_computed", "num_known")}
    arrays.update({f"sampling.{name}": getattr(runner.sampler.rows, name).copy() for name in
                   ("temperature", "top_k", "top_p", "seed", "min_p", "presence", "frequency", "repetition",
                    "min_pos", "logprobs", "prompt_logprobs")})
    rows = {r: (s.row, s.token_ids.tolist()) for r, s in b.requests.items()}
    kv = [t.clone() for cache in runner.kv_caches for t in cache]  # k, v and the scales
    return dict(arrays=arrays, rows=rows, free=list(b.free_rows), last=runner.sampler.last_tokens.clone(), kv=kv)


def _assert_same(before: dict, after: dict) -> None:
    for name, array in before["arrays"].items():
        np.testing.assert_array_equal(after["arrays"][name], array, err_msg=name)
    assert after["rows"] == before["rows"] and after["free"] == before["free"]
    assert torch.equal(after["last"], before["last"])
    assert all(torch.equal(a, b) for a, b in zip(after["kv"], before["kv"]))


def _start(runner) -> list[int]:
    """Request 1 prefilled and decoding (3 tokens so far), request 2 prefilled 6 of 10."""
    runner.reset()
    first = runner.execute(plan([new(1, PROMPT_A, blocks=(1, 2, 3, 4)), new(2, PROMPT_B, blocks=(5, 6, 7, 8), n=6)]))
    tokens_a = [first.sampled()[1]]
    return tokens_a + [runner.execute(plan(cached=decode_rows([1]))).sampled()[1] for _ in range(2)]


def test_each_bad_field_is_refused_by_name_and_changes_nothing(runner, hf_models):
    tokens_a = _start(runner)
    before = _state(runner)
    for name, (bad, message) in PLAN_ERRORS.items():
        with pytest.raises(PlanError) as raised:
            runner.execute(bad)
        assert message in str(raised.value), (name, str(raised.value))
        _assert_same(before, _state(runner))
    for name, (bad, message) in NEW_ROW_ERRORS.items():  # the row alone fails: nothing of it applied
        result = runner.execute(bad)
        assert result.failed_req_ids == [3] and message in result.failed_errors[0], (name, result.failed_errors)
        assert not result.req_ids and not result.error
        _assert_same(before, _state(runner))
    # the next good plans run as if the bad ones had never come; unknown finished ids are ignored
    out = runner.execute(plan(cached=cached_rows((1, 1), (2, 4)), finished=[999]))
    tokens_a.append(out.sampled()[1])
    tokens_b = [out.sampled()[2]]
    for _ in range(2):
        out = runner.execute(plan(cached=decode_rows([1, 2])))
        tokens_a.append(out.sampled()[1])
        tokens_b.append(out.sampled()[2])
    assert tokens_a == hf_greedy(hf_models["tiny-llama"], PROMPT_A, 6)
    assert tokens_b == hf_greedy(hf_models["tiny-llama"], PROMPT_B, 3)


def test_a_bad_cached_row_fails_alone_and_is_forgotten(runner, hf_models):
    ref = {1: hf_greedy(hf_models["tiny-llama"], PROMPT_A, 4), 2: hf_greedy(hf_models["tiny-llama"], PROMPT_B, 1)}
    ref[3] = ref[2]  # request 3 is PROMPT_B too
    for name, (bad, failed, message, sampled) in CACHED_ROW_ERRORS.items():
        _start(runner)
        result = runner.execute(bad)
        assert result.failed_req_ids == [failed] and message in result.failed_errors[0], (name, result.failed_errors)
        assert result.sampled() == {r: ref[r][i] for r, i in sampled.items()}, name
        assert failed not in runner.batch.requests, name
        # what ran is all that changed: the failed row's slot is free for the next request
        assert len(runner.batch.free_rows) == 8 - len(runner.batch.requests), name


def test_a_request_preempted_and_sent_again_in_one_plan_is_accepted(runner):
    runner.reset()
    runner.execute(plan([new(1, PROMPT_B, blocks=(1,))]))
    out = runner.execute(plan([new(1, PROMPT_B, blocks=(2,))], preempted=[1]))
    assert list(out.sampled()) == [1] and runner.batch.block_table[runner.batch.requests[1].row, 0] == 2
