"""Graph replay logic on CPU: a GraphRunner whose 'replay' runs the same padded static-buffer
forward eagerly, so the padding and size choice are checked without a GPU."""

from __future__ import annotations

import pytest

from executor_svc.cuda_graphs import GraphRunner
from executor_svc.plan import CachedRequest, NewRequest, SamplingParams, StepPlan
from tests.executor.conftest import hf_greedy, make_runner

PROMPTS = {1: list(range(3, 40)), 2: [7, 99, 12, 300, 41], 3: list(range(100, 120))}


class EagerGraphs(GraphRunner):
    def __init__(self, runner, sizes):  # no capture on CPU
        self.runner, self.sizes = runner, sorted(sizes)
        self.logits = self._output_buffer()

    def replay(self, size):
        self._run(size, self._metadata(size))
        return self.logits[:size]


@pytest.mark.parametrize("pipelined", [False, True])
def test_padded_decode_replay_matches_transformers(model_dirs, hf_models, pipelined):
    runner = make_runner(model_dirs["tiny-qwen2"])
    runner.graphs = EagerGraphs(runner, (1, 2, 4, 8))
    greedy = SamplingParams()
    new = [NewRequest(r, p, greedy, [4 * r + i for i in range(4)], 0, len(p)) for r, p in PROMPTS.items()]
    out = runner.execute(StepPlan(1, new))
    assert out.graph_size == 0  # prefill runs eagerly
    got = {r: [t] for r, t in out.sampled().items()}
    pending = []  # launched, not finished: at most 2 when pipelined

    def finish_oldest():
        out = runner.finish(pending.pop(0))
        assert out.graph_size == (4 if out.step_id < 5 else 1)
        for r, t in out.sampled().items():
            got[r].append(t)

    for step in range(2, 8):
        req_ids = [1, 2, 3] if step < 5 else [2]  # 3 rows -> graph 4, then 1 row -> graph 1
        pending.append(runner.launch(StepPlan(step, [], [CachedRequest(r, [], 1) for r in req_ids])))
        if len(pending) == (2 if pipelined else 1):
            finish_oldest()
    while pending:
        finish_oldest()
    for r, prompt in PROMPTS.items():
        assert got[r] == hf_greedy(hf_models["tiny-qwen2"], prompt, len(got[r])), r
