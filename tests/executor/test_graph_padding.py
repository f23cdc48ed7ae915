"""Graph replay logic on CPU: a GraphRunner whose 'replay' runs the same padded static-buffer
forward eagerly, so the padding and size choice are checked without a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from executor_svc.cuda_graphs import GraphRunner
from executor_svc.model_runner import ModelRunner
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import decode_rows, hf_greedy, make_runner

PROMPTS = {1: list(range(3, 40)), 2: [7, 99, 12, 300, 41], 3: list(range(100, 120))}


class EagerGraphs(GraphRunner):
    """Captures nothing; a 'replay' runs the graph's forward eagerly over the same buffers."""

    def capture(self):
        pass

    def replay(self, size):
        self._run(size, self._metadata(size))
        return self.logits[:size]


def runner_with_eager_graphs(path, sizes) -> ModelRunner:
    """A CPU runner (built as usual) whose graph runner is an EagerGraphs over its own parts."""
    base = make_runner(path)
    graphs = EagerGraphs(base.model, base.buffers, base.kv_caches, base.batch.last_sampled_gpu, sizes,
                         base.limits.max_model_len)
    info = dataclasses.replace(base.info(), cuda_graph_sizes=tuple(graphs.sizes))
    return ModelRunner(base.model, base.kv_caches, base.batch, base.buffers, base.limits, info, graphs)


@pytest.mark.parametrize("pipelined", [False, True])
def test_padded_decode_replay_matches_transformers(model_dirs, hf_models, pipelined):
    runner = runner_with_eager_graphs(model_dirs["tiny-qwen2"], (1, 2, 4, 8))
    greedy = SamplerParams()
    new = [NewRequestData(r, p, greedy, [4 * r + i for i in range(4)], 0, len(p)) for r, p in PROMPTS.items()]
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
        pending.append(runner.launch(StepPlan(step, [], decode_rows(req_ids))))
        if len(pending) == (2 if pipelined else 1):
            finish_oldest()
    while pending:
        finish_oldest()
    for r, prompt in PROMPTS.items():
        assert got[r] == hf_greedy(hf_models["tiny-qwen2"], prompt, len(got[r])), r


def test_use_graphs_switches_between_replay_and_eager(model_dirs, hf_models):
    runner = runner_with_eager_graphs(model_dirs["tiny-qwen2"], (1, 2, 4, 8))
    prompt = PROMPTS[2]
    new = NewRequestData(1, prompt, SamplerParams(), [1, 2], 0, len(prompt))
    got = list(runner.execute(StepPlan(1, [new])).token_ids)
    sizes = []
    for step, graphs in enumerate((True, False, True, False), start=2):
        runner.use_graphs(graphs)
        out = runner.execute(StepPlan(step, [], decode_rows([1])))
        sizes.append(out.graph_size)
        got += out.token_ids
    assert sizes == [1, 0, 1, 0]
    assert got == hf_greedy(hf_models["tiny-qwen2"], prompt, 5)
