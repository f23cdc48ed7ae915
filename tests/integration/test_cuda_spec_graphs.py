"""Speculative verify steps replayed in CUDA graphs (mixed graphs keep every token's hidden
state): greedy outputs token-exact with speculation off and with eager verify steps, and the
verify steps really replayed a graph (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.random_model import build_random_model
from executor_svc.startup import build_runner
from tests.integration.test_spec_decode import SPEC, generate, prompts_for

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = build_random_model(tmp_path_factory.mktemp("spec-graphs") / "tiny", "tiny-llama")
    return build_runner(ExecutorConfig(
        model=str(path), device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
        num_kv_blocks=96, max_model_len=256, block_size=16, cuda_graph_sizes=(1, 2, 4, 8),
        mixed_cuda_graph_sizes=(8, 16, 32, 64)))


def record_graph_sizes(runner):
    """Wraps runner.launch: the graph size of every launched verify step (0 = eager)."""
    sizes, launch = [], runner.launch

    def recording(plan, *args, **kw):
        handle = launch(plan, *args, **kw)
        if plan.num_draft_tokens:
            sizes.append(handle.out.graph_size)
        return handle

    runner.launch = recording
    return sizes


@pytest.mark.parametrize("depth", [1, 3])
def test_verify_steps_replay_graphs_and_stay_token_exact(runner, depth):
    prompts = prompts_for(runner.info().vocab_size)
    runner.use_graphs(True)
    reference, _ = generate(runner, prompts, None, depth=depth)
    sizes = record_graph_sizes(runner)
    try:
        in_graphs, scheduler = generate(runner, prompts, SPEC, depth=depth)
    finally:
        del runner.launch  # the instance attribute: the method again
    runner.use_graphs(False)
    try:
        eager, _ = generate(runner, prompts, SPEC, depth=depth)
    finally:
        runner.use_graphs(True)
    assert in_graphs == reference == eager
    stats = scheduler.spec.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert sizes and all(s in (8, 16, 32, 64) for s in sizes), sizes  # every verify step replayed
