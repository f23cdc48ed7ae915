"""Graph replay logic on CPU: a GraphRunner whose 'replay' runs the same padded static-buffer
forward eagerly, so the padding and size choice are checked without a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from executor_svc.worker.cuda_graphs import GraphRunner
from executor_svc.worker.model_runner import ModelRunner
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, hf_greedy, make_runner

PROMPTS = {1: list(range(3, 40)), 2: [7, 99, 12, 300, 41], 3: list(range(100, 120))}


class EagerGraphs(GraphRunner):
    """Captures nothing; a 'replay' runs the graph's forward eagerly over the same buffers."""

    def capture(self):
        pass

    def replay(self, shape):
        self._run(shape, self._metadata(shape))
        return self.logits[:shape.num_reqs]


def runner_with_eager_graphs(path, sizes, mixed_sizes=()) -> ModelRunner:
    """A CPU runner (built as usual) whose graph runner is an EagerGraphs over its own parts."""
    base = make_runner(path)
    graphs = EagerGraphs(base.model, base.buffers, base.kv_caches, base.sampler.last_tokens, sizes,
                         base.limits.max_model_len, mixed_sizes)
    info = dataclasses.replace(base.info(), cuda_graph_sizes=tuple(graphs.sizes))
    return ModelRunner(base.model, base.kv_caches, base.batch, base.buffers, base.sampler, base.limits, info,
                       graphs)


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


def test_mixed_steps_replay_padded_mixed_graphs_and_match_transformers(model_dirs, hf_models):
    """Chunked prefill, a prefill beside decode rows and admissions mid-stream, each through a
    mixed graph of the next token count up (8 rows: every padded request and token harmless);
    pure decode through the decode graphs; prompt logprobs through a mixed graph (its hidden
    states), equal to eager; steps past 64 tokens eagerly."""
    runner = runner_with_eager_graphs(model_dirs["tiny-qwen2"], (1, 2, 4, 8), (16, 32, 64))
    greedy = SamplerParams()
    long_prompt = list(range(3, 80))  # 77 tokens
    blocks = {r: [8 * r + i for i in range(8)] for r in (1, 2, 3, 4)}
    got = {r: [] for r in blocks}
    sizes = []

    def run(step, new=(), cached=()):
        out = runner.execute(StepPlan(step, list(new), cached_rows(*cached)))
        sizes.append(out.graph_size)
        for r, t in out.sampled().items():
            got[r].append(t)

    run(1, [NewRequestData(1, PROMPTS[1], greedy, blocks[1], 0, 20)])  # 20 of 37: samples nothing
    run(2, [NewRequestData(2, PROMPTS[2], greedy, blocks[2], 0, 5)], [(1, 17)])  # 22 tokens
    run(3, [NewRequestData(3, PROMPTS[3], greedy, blocks[3], 0, 20)], [(1, 1), (2, 1)])  # 22
    for step in range(4, 7):
        run(step, cached=[(1, 1), (2, 1), (3, 1)])
    run(7, [NewRequestData(4, long_prompt, greedy, blocks[4], 0, 77)], [(1, 1), (2, 1), (3, 1)])  # 80
    for step in range(8, 10):
        run(step, cached=[(1, 1), (2, 1), (3, 1), (4, 1)])
    assert sizes == [32, 32, 32, 4, 4, 4, 0, 4, 4]
    prompts = {**PROMPTS, 4: long_prompt}
    for r, tokens in got.items():
        assert tokens == hf_greedy(hf_models["tiny-qwen2"], prompts[r], len(tokens)), r
    assert [len(got[r]) for r in (1, 2, 3, 4)] == [8, 8, 7, 3]

    # prompt logprobs need every token's hidden state: the mixed graph's buffer of them
    logprobs = SamplerParams(prompt_logprobs=2)
    out = runner.execute(StepPlan(10, [NewRequestData(5, PROMPTS[2], logprobs, [40, 41], 0, 5)]))
    runner.use_graphs(False)
    eager = runner.execute(StepPlan(11, [NewRequestData(6, PROMPTS[2], logprobs, [42, 43], 0, 5)]))
    runner.use_graphs(True)
    assert (out.graph_size, eager.graph_size) == (16, 0) and out.token_ids == eager.token_ids
    got, want = out.prompt_logprobs.values, eager.prompt_logprobs.values
    assert out.prompt_logprobs.counts == [4] and got.token_ids == want.token_ids == PROMPTS[2][1:]
    assert got.top_token_ids == want.top_token_ids and got.ranks == want.ranks
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)


@pytest.mark.parametrize("sizes,mixed_sizes,decode_sizes", [
    ((1, 2, 4, 8, 16, 32), (64,), {4, 8}),  # verify steps as token rows: decode graphs (64: a prefill rode along)
    ((1, 2), (16, 32, 64), set()),  # more tokens than the decode graphs hold: mixed graphs
])
def test_verify_steps_replay_graphs_token_exact(model_dirs, sizes, mixed_sizes, decode_sizes):
    """Speculative verify rows through graphs: as token rows (step_inputs.py), each token a decode
    row of a decode graph, when the step fits one; else through a mixed graph, the drafts'
    logits from its hidden-state buffer. Greedy outputs equal those without speculation."""
    from tests.integration.test_spec_decode import (
        SPEC,
        generate,
        prompts_for,
        record_graph_sizes,
    )

    runner = runner_with_eager_graphs(model_dirs["tiny-llama"], sizes, mixed_sizes)
    prompts = prompts_for(runner.info().vocab_size)
    reference, _ = generate(runner, prompts, None, depth=3)
    got = record_graph_sizes(runner)
    tokens, scheduler = generate(runner, prompts, SPEC, depth=3)
    assert tokens == reference
    assert 0 < scheduler.spec.stats.num_accepted_tokens < scheduler.spec.stats.num_draft_tokens
    assert got and all(size in (sizes if decode else mixed_sizes) for size, decode in got), got  # all replayed
    decode = {size for size, is_decode in got if is_decode}
    assert decode == decode_sizes, got
    if decode_sizes:  # a mixed graph only for the two steps that a prefill chunk rode along
        assert sum(not is_decode for _, is_decode in got) == 2, got
