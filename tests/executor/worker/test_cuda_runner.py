"""The executor on a GPU: bf16 loading, graph replay == eager (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_random_model
    from tests.executor.cuda_helpers import cuda_runner

    path = build_random_model(tmp_path_factory.mktemp("m") / "tiny", "tiny-llama")
    return cuda_runner(path, dtype="float32", max_num_seqs=64, cuda_graph_sizes=GRAPH_SIZES,
                       num_kv_blocks=64 * 16 + 1)


GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)  # the default sizes for 64 rows


@pytest.fixture(scope="module")
def llama_1b(tmp_path_factory):
    """A random bf16 model of llama-1b's shapes (2.5 GB written once for the module's tests)."""
    from executor_svc.model_loader.random_model import build_random_model

    return build_random_model(tmp_path_factory.mktemp("1b") / "1b", "llama-1b", dtype=torch.bfloat16, device="cuda")


@pytest.mark.parametrize("graph_size", GRAPH_SIZES)
def test_graph_tokens_equal_eager_for_every_captured_size(tiny_runner, graph_size):
    """Each size replayed with its padded rows: one more request than the size below it."""
    from tests.executor.cuda_helpers import check_graph_tokens_equal_eager

    i = GRAPH_SIZES.index(graph_size)
    num_reqs = GRAPH_SIZES[i - 1] + 1 if i else 1
    assert check_graph_tokens_equal_eager(tiny_runner, num_reqs) == graph_size


def test_bf16_tiny_and_prefill_too_large_for_graphs_runs_eagerly(tmp_path):
    from executor_svc.model_loader.random_model import build_random_model
    from tests.executor.cuda_helpers import Driver, cuda_runner

    runner = cuda_runner(build_random_model(tmp_path / "q3", "tiny-qwen3", dtype=torch.bfloat16),
                         cuda_graph_sizes=(1, 2), mixed_cuda_graph_sizes=(), num_kv_blocks=256)
    assert runner.info().dtype == "bfloat16" and runner.info().cuda_graph_sizes == (1, 2)
    d = Driver(runner, 3)
    assert d.decode(2) == [0, 0]  # 3 rows > largest graph: eager


@pytest.mark.cuda_slow
@pytest.mark.gpu_exclusive  # alone on the GPU under xdist: it measures free memory
def test_llama_1b_shape_graph_logits_match_eager(llama_1b):
    from tests.executor.cuda_helpers import cuda_runner, decode_logits_graph_and_eager, memory_share

    # no mixed graphs: the prefills run eagerly, the decode steps compared are the same
    runner = cuda_runner(llama_1b, cuda_graph_sizes=(1, 4, 64), mixed_cuda_graph_sizes=(), num_kv_blocks=0,
                         gpu_memory_utilization=memory_share(8 << 30))
    assert runner.info().num_blocks > 1000  # measured from free memory
    for n, size in ((1, 1), (3, 4), (64, 64)):
        g, e, got = decode_logits_graph_and_eager(runner, n)
        assert got == size
        assert ((g - e).abs().max() / e.abs().max()).item() < 3e-2
        assert (g.argmax(-1) == e.argmax(-1)).float().mean().item() >= 0.9


@pytest.mark.parametrize("graphs", [True, False])
def test_launch_never_syncs_and_pipelined_tokens_equal_sequential(tiny_runner, graphs):
    """launch() under torch.cuda.set_sync_debug_mode("error"): any host sync raises. Two steps
    outstanding (launch N+1 before finish N) give the tokens of execute() one by one."""
    from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
    from tests.executor.conftest import decode_rows
    from tests.executor.cuda_helpers import Driver, launch_without_sync

    runner = tiny_runner
    runner.use_graphs(graphs)
    try:
        sequential = Driver(runner, 3)
        sequential.decode(6)
        d = Driver(runner, 3)
        d.decode(1)  # warm-up of this path
        plans = [StepPlan(100 + i, [], decode_rows(d.req_ids)) for i in range(5)]
        pending, outs = [], []
        for plan in plans:
            pending.append(launch_without_sync(runner, plan))
            if len(pending) == 2:
                outs.append(runner.finish(pending.pop(0)))
        outs += [runner.finish(h) for h in pending]
        for out in outs:
            for r, t in out.sampled().items():
                d.tokens[r].append(t)
        assert d.tokens == sequential.tokens
        assert all(o.graph_size == (4 if graphs else 0) and o.forward_us > 0 for o in outs)
        # an eager prefill (varlen attention) and a sampled (temperature, top-k/p) request
        params = SamplerParams(temperature=0.7, top_k=20, top_p=0.9, seed=3)
        new = NewRequestData(9, list(range(2, 50)), params, list(range(400, 404)), 0, 48)
        out = runner.finish(launch_without_sync(runner, StepPlan(200, [new])))
        assert out.req_ids == [9] and out.graph_size == (64 if graphs else 0)  # a mixed graph
    finally:
        runner.use_graphs(True)
        runner.reset()


def test_mixed_graphs_tokens_equal_eager(tiny_runner):
    """Chunked prefill, prefills beside decode rows, admissions mid-stream: the mixed graphs
    (padded to the next token count) give the tokens of eager steps."""
    from tests.executor.cuda_helpers import mixed_scenario

    graphs = mixed_scenario(tiny_runner)
    tiny_runner.use_graphs(False)
    try:
        eager = mixed_scenario(tiny_runner)
    finally:
        tiny_runner.use_graphs(True)
    assert graphs[0] == eager[0]
    assert graphs[1] == [32, 64, 64, 4, 4, 96, 4] and eager[1] == [0] * 7


@pytest.mark.cuda_slow
def test_llama_1b_shape_mixed_graph_logits_match_eager(llama_1b):
    from tests.executor.cuda_helpers import cuda_runner, mixed_logits_graph_and_eager

    runner = cuda_runner(llama_1b, cuda_graph_sizes=(1, 4), mixed_cuda_graph_sizes=(64, 512))
    for num_decode, chunk, size in ((3, 40, 64), (60, 300, 512)):
        g, e, got = mixed_logits_graph_and_eager(runner, num_decode, chunk)
        assert got == size and g.shape == e.shape == (num_decode + 1, runner.info().vocab_size)
        assert ((g - e).abs().max() / e.abs().max()).item() < 3e-2
        assert (g.argmax(-1) == e.argmax(-1)).float().mean().item() >= 0.9
