"""The executor on a GPU: bf16 loading, graph replay == eager (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory):
    from executor_svc.random_model import build_random_model
    from tests.executor.cuda_check import cuda_runner

    path = build_random_model(tmp_path_factory.mktemp("m") / "tiny", "tiny-llama")
    return cuda_runner(path, dtype="float32", cuda_graph_sizes=(1, 2, 4, 8), num_kv_blocks=512)


@pytest.mark.parametrize("num_reqs,graph_size", [(1, 1), (3, 4), (8, 8)])
def test_graph_tokens_equal_eager(tiny_runner, num_reqs, graph_size):
    from tests.executor.cuda_check import check_graph_tokens_equal_eager

    assert check_graph_tokens_equal_eager(tiny_runner, num_reqs) == graph_size


def test_bf16_tiny_and_prefill_too_large_for_graphs_runs_eagerly(tmp_path):
    from executor_svc.random_model import build_random_model
    from tests.executor.cuda_check import Driver, cuda_runner

    runner = cuda_runner(build_random_model(tmp_path / "q3", "tiny-qwen3", dtype=torch.bfloat16),
                         cuda_graph_sizes=(1, 2), num_kv_blocks=256)
    assert runner.info().dtype == "bfloat16" and runner.info().cuda_graph_sizes == (1, 2)
    d = Driver(runner, 3)
    assert d.decode(2) == [0, 0]  # 3 rows > largest graph: eager


def test_llama_1b_shape_graph_logits_match_eager(tmp_path):
    from executor_svc.random_model import build_random_model
    from tests.executor.cuda_check import cuda_runner, decode_logits_graph_and_eager

    path = build_random_model(tmp_path / "1b", "llama-1b", dtype=torch.bfloat16, device="cuda")
    runner = cuda_runner(path, cuda_graph_sizes=(1, 4, 64))
    assert runner.num_blocks > 1000  # measured from free memory
    for n, size in ((1, 1), (3, 4), (64, 64)):
        g, e, got = decode_logits_graph_and_eager(runner, n)
        assert got == size
        assert ((g - e).abs().max() / e.abs().max()).item() < 3e-2
        assert (g.argmax(-1) == e.argmax(-1)).float().mean().item() >= 0.9
