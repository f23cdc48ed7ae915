"""Speculative verify steps replayed in CUDA graphs (decode graphs of token rows, or mixed graphs,
which keep every token's hidden state): greedy outputs token-exact with speculation off and with
eager verify steps, and the verify steps really replayed a graph (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.startup.build import build_runner
from tests.integration.test_spec_decode import (
    SPEC,
    generate,
    prompts_for,
    record_graph_sizes,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = build_random_model(tmp_path_factory.mktemp("spec-graphs") / "tiny", "tiny-llama")
    return build_runner(ExecutorConfig(
        model=str(path), device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
        num_kv_blocks=96, max_model_len=256, block_size=16, cuda_graph_sizes=(1, 2, 4, 8),
        mixed_cuda_graph_sizes=(8, 16, 32, 64)))


class Recording(dict):
    """A tail's graphs that note each (size, kind) replayed."""

    def __init__(self, graphs: dict):
        super().__init__(graphs)
        self.replayed: list[tuple[int, str]] = []

    def get(self, key, default=None):
        graph = super().get(key, default)
        if graph is not None:
            self.replayed.append(key)
        return graph


@pytest.mark.parametrize("depth", [1, 3])
def test_verify_steps_replay_graphs_and_stay_token_exact(runner, depth):
    prompts = prompts_for(runner.info().vocab_size)
    runner.use_graphs(True)
    reference, _ = generate(runner, prompts, None, depth=depth)
    sizes = record_graph_sizes(runner)
    tail, captured = runner.verifier.tail, runner.verifier.tail.graphs
    assert sorted(captured) == [(s, k) for s in (1, 2, 4, 8) for k in ("greedy", "random")]  # verify_tail.py
    tail.graphs = recording = Recording(captured)
    try:
        in_graphs, scheduler = generate(runner, prompts, SPEC, depth=depth)
    finally:
        del runner.launch  # the instance attribute: the method again
        tail.graphs = captured
    assert {kind for _, kind in recording.replayed} == {"greedy"}, "no greedy verify step replayed its tail's graph"
    runner.use_graphs(False)
    try:
        eager, _ = generate(runner, prompts, SPEC, depth=depth)
    finally:
        runner.use_graphs(True)
    assert in_graphs == reference == eager
    stats = scheduler.spec.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert sizes and all(size > 0 for size, _ in sizes), sizes  # every verify step replayed a graph
    assert any(decode for _, decode in sizes), sizes  # token rows: decode graphs


@pytest.mark.parametrize("draft_name", ["same", "small"])
def test_draft_model_on_cuda_with_graphs_is_token_exact(tmp_path_factory, draft_name):
    """The draft model's forwards (its decode graphs for one-token catch-ups, else eager) before
    target graphs / verify graphs on CUDA: greedy outputs equal those without speculation; a
    draft equal to the target accepts every draft (so its graph-written KV is right)."""
    from llmserve.speculative import SpecDecodeConfig

    base = tmp_path_factory.mktemp("cuda-draft")
    target = build_random_model(base / "target", "tiny-llama")
    draft = target if draft_name == "same" else build_random_model(
        base / "small", "tiny-llama", seed=1, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64)
    runner = build_runner(ExecutorConfig(
        model=str(target), device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
        num_kv_blocks=96, max_model_len=256, block_size=16, cuda_graph_sizes=(1, 2, 4, 8),
        mixed_cuda_graph_sizes=(8, 16, 32, 64), speculative_model=str(draft), num_speculative_tokens=4))
    prompts = prompts_for(runner.info().vocab_size)
    reference, _ = generate(runner, prompts, None, depth=3)
    spec = SpecDecodeConfig("draft_model", num_speculative_tokens=4, model=runner.info().draft_model_path)
    sizes = record_graph_sizes(runner)
    try:
        tokens, scheduler = generate(runner, prompts, spec, depth=3)
    finally:
        del runner.launch
    assert tokens == reference
    stats = scheduler.spec.stats
    assert stats.num_draft_tokens > 0 and sizes and all(size > 0 for size, _ in sizes), sizes
    if draft_name == "same":
        assert stats.num_accepted_tokens == stats.num_draft_tokens


def test_draft_decode_graphs_write_the_eager_kv(tmp_path_factory):
    """The draft's one-token catch-up steps replay its decode graphs (spec_decode/draft.py) and write
    the same draft KV as eager catch-ups (fp32), over whole generations without speculation."""
    base = tmp_path_factory.mktemp("cuda-draft-kv")
    target = build_random_model(base / "target", "tiny-llama")
    draft = build_random_model(base / "small", "tiny-llama", seed=1, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    runners = [build_runner(ExecutorConfig(
        model=str(target), device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
        num_kv_blocks=96, max_model_len=256, block_size=16, cuda_graph_sizes=(1, 2, 4, 8),
        mixed_cuda_graph_sizes=(8, 16, 32, 64), speculative_model=str(draft), num_speculative_tokens=4))
        for _ in range(2)]
    graphs, replays = runners[0].drafter.graphs, []
    replay = graphs.replay
    graphs.replay = lambda shape: replays.append(shape) or replay(shape)
    runners[1].drafter.graphs = None  # eager catch-ups
    prompts = prompts_for(runners[0].info().vocab_size)
    outputs = [generate(r, prompts, None, depth=3)[0] for r in runners]
    assert outputs[0] == outputs[1] and len(replays) > 20
    torch.cuda.synchronize()
    for a, b in zip(runners[0].drafter.kv_caches, runners[1].drafter.kv_caches):
        torch.testing.assert_close(a.k, b.k, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.v, b.v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_greedy_verify_step_launches_without_a_host_sync(runner, graphs):
    """A greedy token-rows verify step (its tail: greedy_tail.py, a replay or eager) launched
    under torch.cuda.set_sync_debug_mode("error"): its copies to the host never block (a strided
    copy to pinned memory once went through a pageable temporary and did); tokens exact."""
    from tests.executor.cuda_helpers import launch_without_sync
    from tests.executor.spec_decode.test_spec_chain import greedy, start, verify_row

    runner.use_graphs(graphs)
    try:
        ref = greedy(runner, 8)
        assert start(runner) == ref[0]
        out = runner.finish(launch_without_sync(runner, verify_row(1, ref[1:4])))  # every draft accepted
        assert (out.token_ids, out.num_tokens) == (ref[1:5], [4])
        assert out.graph_size == (4 if graphs else 0)  # 1 + 3 token rows: the decode graph of 4
    finally:
        runner.use_graphs(True)


def test_random_verify_steps_replay_their_tail_and_give_the_scan_paths_tokens(runner):
    """Seeded random rows with drafts (spec_decode/verify_tail.py's random tail): replayed in its
    graphs, run eagerly, and through the scan path (steps not laid out as token rows), the same
    tokens; the steps of more tokens than the largest graph (8) take the scan path in all three."""
    from unittest import mock

    from tests.executor.spec_decode.test_spec_random_tail import _greedy_continuations, _run

    drafts = [(1, 1, 2), (2, 1, 0), (1, 2, 1), (2, 2, 2), (3, 0, 1)]  # 7, 6, 7, 9 (no tail) and 6 tokens
    runner.use_graphs(True)
    refs = _greedy_continuations(runner, 24)
    tail, captured = runner.verifier.tail, runner.verifier.tail.graphs
    tail.graphs = recording = Recording(captured)
    try:
        in_graphs = _run(runner, refs, drafts=drafts)
    finally:
        tail.graphs = captured
    assert [kind for _, kind in recording.replayed] == ["random"] * 4
    with mock.patch("executor_svc.worker.model_runner.use_token_rows", return_value=False):
        scan = _run(runner, refs, drafts=drafts)
    runner.use_graphs(False)
    try:
        eager = _run(runner, refs, drafts=drafts)
    finally:
        runner.use_graphs(True)
    assert in_graphs == scan == eager
    assert any(0 < n < d + 1 for (_, counts), step in zip(in_graphs[1:], drafts) for n, d in zip(counts, step))


def test_a_random_verify_step_launches_without_a_host_sync(runner):
    from step_protocol.domain import StepPlan
    from tests.executor.conftest import cached_rows
    from tests.executor.cuda_helpers import launch_without_sync
    from tests.executor.spec_decode.test_spec_random_tail import PARAMS, _new

    runner.use_graphs(True)
    runner.reset()
    runner.execute(StepPlan(0, new_requests=_new(PARAMS)))
    plan = StepPlan(1, cached_requests=cached_rows((1, 3), (2, 2), (3, 1)), num_draft_tokens=[2, 1, 0],
                    draft_token_ids=[5, 6, 7])
    out = runner.finish(launch_without_sync(runner, plan))
    assert out.graph_size == 8 and len(out.num_tokens) == 3 and 3 <= len(out.token_ids) <= 6  # 6 token rows
