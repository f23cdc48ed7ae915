"""ModelRunner.execute with hand-made plans is token-exact with transformers' greedy generate."""

from __future__ import annotations

import pytest

from executor_svc.worker.host_device import HOST_SETS
from executor_svc.worker.plan_checks import PlanError
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, hf_greedy, make_runner

GREEDY = SamplerParams()
PROMPT_A = list(range(3, 40))  # 37 tokens
PROMPT_B = [7, 99, 12, 300, 41, 5, 6, 8, 250, 11]  # 10 tokens


@pytest.fixture(scope="module")
def runner(model_dirs):
    return make_runner(model_dirs["tiny-llama"])


@pytest.fixture(autouse=True)
def _fresh(runner):
    runner.reset()


class Driver:
    """A minimal scheduler: step ids, block ids handed out 4 per request (64 tokens)."""

    def __init__(self, runner):
        self.runner, self.step_id, self.next_block = runner, 0, 1

    def blocks(self, n: int = 4) -> list[int]:
        ids = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        return ids

    def step(self, new=(), cached: CachedRequestData | None = None, finished=(),
             preempted=()) -> dict[int, int]:
        self.step_id += 1
        cached = cached or CachedRequestData()
        out = self.runner.execute(StepPlan(self.step_id, list(new), cached, list(finished), list(preempted)))
        assert out.graph_size == 0 and out.step_id == self.step_id
        # the launch's thread CPU time: part of its wall time (a plan with no rows launches nothing)
        assert (out.launch_cpu_us > 0) == bool(new or cached.req_ids) and out.launch_cpu_us <= out.launch_us + 1
        return out.sampled()

    def decode(self, req_ids, num_steps: int) -> dict[int, list[int]]:
        got = {r: [] for r in req_ids}
        for _ in range(num_steps):
            sampled = self.step(cached=decode_rows(req_ids))
            assert set(sampled) == set(req_ids)
            for r in req_ids:
                got[r].append(sampled[r])
        return got


def test_prefill_then_decode(runner, hf_models):
    d = Driver(runner)
    first = d.step(new=[NewRequestData(1, PROMPT_A, GREEDY, d.blocks(), 0, len(PROMPT_A))])
    rest = d.decode([1], 9)[1]
    assert [first[1]] + rest == hf_greedy(hf_models["tiny-llama"], PROMPT_A, 10)


def test_chunked_prefill_over_three_steps(runner, hf_models):
    d = Driver(runner)
    assert d.step(new=[NewRequestData(1, PROMPT_A, GREEDY, d.blocks(), 0, 15)]) == {}  # partial chunk
    assert d.step(cached=cached_rows((1, 15))) == {}
    first = d.step(cached=cached_rows((1, 7)))
    rest = d.decode([1], 5)[1]
    assert [first[1]] + rest == hf_greedy(hf_models["tiny-llama"], PROMPT_A, 6)


def test_two_requests_of_different_lengths(runner, hf_models):
    d = Driver(runner)
    first = d.step(new=[NewRequestData(1, PROMPT_A, GREEDY, d.blocks(), 0, len(PROMPT_A)),
                        NewRequestData(2, PROMPT_B, GREEDY, d.blocks(), 0, len(PROMPT_B))])
    rest = d.decode([2, 1], 7)
    for req_id, prompt in ((1, PROMPT_A), (2, PROMPT_B)):
        assert [first[req_id]] + rest[req_id] == hf_greedy(hf_models["tiny-llama"], prompt, 8)


def test_mixed_prefill_and_decode_step_with_block_delta(runner, hf_models):
    d = Driver(runner)
    first_b = d.step(new=[NewRequestData(2, PROMPT_B, GREEDY, [d.blocks(1)[0]], 0, len(PROMPT_B))])
    # request 2 decodes (and crosses into a newly appended block) while request 1 prefills
    got_b = [first_b[2]]
    for i in range(8):
        new_blocks = d.blocks(1) if len(PROMPT_B) + i == 16 else []
        new = [NewRequestData(1, PROMPT_A, GREEDY, d.blocks(), 0, len(PROMPT_A))] if i == 2 else []
        sampled = d.step(new=new, cached=cached_rows((2, 1, new_blocks)))
        got_b.append(sampled[2])
        if i == 2:
            first_a = sampled[1]
    rest_a = d.decode([1], 3)[1]
    assert got_b == hf_greedy(hf_models["tiny-llama"], PROMPT_B, 9)
    assert [first_a] + rest_a == hf_greedy(hf_models["tiny-llama"], PROMPT_A, 4)


def test_preempted_request_resumes(runner, hf_models):
    d = Driver(runner)
    first = d.step(new=[NewRequestData(1, PROMPT_B, GREEDY, d.blocks(), 0, len(PROMPT_B))])
    generated = [first[1]] + d.decode([1], 3)[1]
    d.step(preempted=[1])  # forgotten; its blocks go back to the scheduler
    assert 1 not in runner.batch.requests
    resumed = PROMPT_B + generated  # the last generated token's KV was never computed
    first = d.step(new=[NewRequestData(1, resumed, GREEDY, d.blocks(), 0, len(resumed))])
    generated += [first[1]] + d.decode([1], 3)[1]
    assert generated == hf_greedy(hf_models["tiny-llama"], PROMPT_B, 8)


def test_new_request_on_cached_prefix_blocks(runner, hf_models):
    """Prefix caching: request 2 starts with request 1's first two full blocks (32 tokens),
    arrives with num_computed_tokens=32 and computes only its tail; both then decode while
    sharing those blocks, with the tokens of computing everything."""
    hf = hf_models["tiny-llama"]
    d = Driver(runner)
    blocks_1 = d.blocks()
    first_1 = d.step(new=[NewRequestData(1, PROMPT_A, GREEDY, blocks_1, 0, len(PROMPT_A))])
    prompt_2 = PROMPT_A[:32] + PROMPT_B[:5]
    first_2 = d.step(new=[NewRequestData(2, prompt_2, GREEDY, blocks_1[:2] + d.blocks(2), 32, 5)],
                     cached=decode_rows([1]))
    rest = d.decode([1, 2], 5)
    assert [first_2[2]] + rest[2] == hf_greedy(hf, prompt_2, 6)
    assert [first_1[1], first_2[1]] + rest[1] == hf_greedy(hf, PROMPT_A, 7)  # its blocks unharmed


def test_finished_request_frees_its_row(runner):
    d = Driver(runner)
    d.step(new=[NewRequestData(5, PROMPT_B, GREEDY, d.blocks(), 0, len(PROMPT_B))])
    free = len(runner.batch.free_rows)
    d.step(finished=[5])
    assert len(runner.batch.free_rows) == free + 1 and not runner.batch.requests


def test_bad_plans_raise_and_bad_rows_fail_alone(runner):
    d = Driver(runner)
    with pytest.raises(PlanError, match="scheduled twice"):  # the whole plan's fault
        d.step(cached=decode_rows([42, 42]))
    result = runner.execute(StepPlan(1, cached_requests=decode_rows([42])))
    assert result.failed_req_ids == [42] and "42 is not running" in result.failed_errors[0]
    # more tokens than its one block holds: that request's fault
    result = runner.execute(StepPlan(2, [NewRequestData(1, PROMPT_A, GREEDY, d.blocks(1), 0, len(PROMPT_A))]))
    assert result.failed_req_ids == [1] and "do not fit" in result.failed_errors[0]
    assert not runner.batch.requests and not result.req_ids


def test_seeded_sampling_is_reproducible_across_runs(runner):
    params = SamplerParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234)

    def generate() -> list[int]:
        runner.reset()
        d = Driver(runner)
        first = d.step(new=[NewRequestData(1, PROMPT_A, params, d.blocks(), 0, len(PROMPT_A))])
        return [first[1]] + d.decode([1], 6)[1]

    assert generate() == generate()


def test_pipelined_launch_finish_equals_sequential_execute(runner, hf_models):
    """launch(N), launch(N+1), finish(N), finish(N+1): the same tokens as execute() one by one."""
    prompts = {1: PROMPT_A, 2: PROMPT_B, 3: PROMPT_A[5:20]}
    num_decode = 8

    def plans(d: Driver) -> list[StepPlan]:
        new = [NewRequestData(r, p, GREEDY, d.blocks(), 0, len(p)) for r, p in prompts.items()]
        out = [StepPlan(1, new[:2])]  # request 3 joins while 1 and 2 decode
        for i in range(num_decode):
            cached = decode_rows((1, 2, 3) if i >= 2 else (1, 2))
            out.append(StepPlan(2 + i, new[2:] if i == 1 else [], cached))
        out.append(StepPlan(2 + num_decode, finished_req_ids=[1, 2, 3]))
        return out

    runner.reset()
    sequential = [runner.execute(p) for p in plans(Driver(runner))]
    runner.reset()
    handles, pipelined = [], []
    for plan in plans(Driver(runner)):
        handles.append(runner.launch(plan))
        if len(handles) == 2:
            pipelined.append(runner.finish(handles.pop(0)))
    pipelined += [runner.finish(h) for h in handles]
    assert [(o.step_id, o.sampled()) for o in pipelined] == [(o.step_id, o.sampled()) for o in sequential]
    got = {r: [] for r in prompts}
    for o in pipelined:
        for r, t in o.sampled().items():
            got[r].append(t)
    for r, prompt in prompts.items():
        assert got[r] == hf_greedy(hf_models["tiny-llama"], prompt, len(got[r])), r
    assert pipelined[-1].req_ids == []


def test_finish_is_idempotent_and_a_launch_past_the_host_sets_finishes_the_oldest(runner, hf_models):
    d = Driver(runner)
    handles = [runner.launch(StepPlan(1, [NewRequestData(1, PROMPT_B, GREEDY, d.blocks(), 0, len(PROMPT_B))]))]
    for step in range(2, HOST_SETS + 1):  # one launch a host set: none finished yet
        handles.append(runner.launch(StepPlan(step, [], decode_rows([1]))))
        assert not handles[0].finished
    last = runner.launch(StepPlan(HOST_SETS + 1, [], decode_rows([1])))  # reuses the first's buffers
    handles.append(last)
    assert handles[0].finished and not last.finished
    tokens = [runner.finish(h).token_ids[0] for h in handles]
    again = runner.finish(last)
    assert again is last.out and again.token_ids == [tokens[-1]]  # again: the same output, unchanged
    assert tokens == hf_greedy(hf_models["tiny-llama"], PROMPT_B, HOST_SETS + 1)
