"""Tensor parallelism on 2 gloo ranks (CPU, float32): the same greedy tokens as one rank and
logits within the all-reduce's rounding, for Llama, Qwen2 (qkv bias), Qwen3 (q/k norm), GQA
with fewer KV heads than ranks (replicated), sliding windows, tied embeddings and an odd
vocabulary (padded shard)."""

from __future__ import annotations

import numpy as np
import pytest

from executor_svc.model_loader.random_model import build_random_model
from executor_svc.parallel.state import ParallelError, TensorParallel
from tests.executor.tp_helpers import model_greedy, run_ranks, runner_scenario, single

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 11, 300, 23, 8, 190, 77, 2, 140, 33, 9]


def _compare(path, num_tokens: int = 12, size: int = 2) -> list[tuple]:
    """Checks every rank against one; returns the ranks' shapes (heads, KV heads, MLP, vocab)."""
    ref_tokens, ref_logits, _ = single(model_greedy, path, PROMPT, num_tokens)
    ranks = run_ranks(size, model_greedy, path, PROMPT, num_tokens)
    for tokens, logits, _ in ranks:
        np.testing.assert_allclose(np.stack(logits), np.stack(ref_logits), atol=1e-4, rtol=1e-4)
        assert tokens == ref_tokens
    return [shape for _, _, shape in ranks]


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_two_ranks_give_the_tokens_of_one(arch, model_dirs):
    assert _compare(model_dirs[arch]) == [(2, 1, 64, 256)] * 2  # 4 heads, 2 KV heads, 128 MLP, 512


def test_fewer_kv_heads_than_ranks_replicates_them(tmp_path):
    assert _compare(build_random_model(tmp_path / "m", "tiny-qwen3", num_key_value_heads=1)) == [(2, 1, 64, 256)] * 2


def test_sliding_window_tied_embeddings_and_odd_vocabulary(tmp_path):
    path = build_random_model(tmp_path / "m", "tiny-mistral", sliding_window=8, vocab_size=509,
                              tie_word_embeddings=True)
    assert _compare(path, num_tokens=16) == [(2, 1, 64, 255)] * 2


def test_shapes_that_do_not_split_are_refused():
    tp = TensorParallel(0, 3)
    with pytest.raises(ParallelError, match="does not divide the 4 attention heads"):
        tp.split(4, "attention heads")
    with pytest.raises(ParallelError, match="not a multiple of the 2 KV heads"):
        TensorParallel(0, 3).kv_heads(2)
    assert TensorParallel(3, 4).kv_heads(2) == 1 and TensorParallel(3, 4).kv_head_start(2) == 1


def test_runner_on_two_ranks_answers_as_one(model_dirs):
    """TensorParallelRanks: rank 0 sends each plan, samples once and broadcasts the ids;
    greedy, seeded sampling with penalties, logprobs, prompt logprobs, a refused plan, rows
    that fail alone and a reset give rank 0 the results of one rank."""
    path = model_dirs["tiny-qwen2"]
    ref_blocks, ref = single(runner_scenario, path)
    (blocks, got), worker_blocks = run_ranks(2, runner_scenario, path)
    assert blocks == worker_blocks == ref_blocks == 64
    assert len(got) == len(ref) and got[8][0] == "refused"
    assert got[9][2] == [9, 5] and got[10][2] == [3] and got[11][0] == [1]  # rows that failed alone
    for g, r in zip(got, ref):
        assert g[:3] == r[:3]  # request ids, token ids and failed rows exact
        for a, b in zip(g[3:], r[3:]):
            if isinstance(a, tuple):
                np.testing.assert_allclose(a[0], b[0], atol=1e-4)
                assert a[1] == b[1]
            elif a is not None or b is not None:
                np.testing.assert_allclose(a, b, atol=1e-4)


def test_the_flag_goes_from_the_launcher_to_the_executor():
    from executor_svc.config import ExecutorConfig
    from llmserve.flags import commands, parse_args

    executor, scheduler = commands(parse_args(["--tensor-parallel-size", "2"]), http_api=True)
    assert executor[-2:] == ["--tensor-parallel-size", "2"] and "--tensor-parallel-size" not in scheduler
    assert ExecutorConfig.from_args(executor[3:] + ["--device", "cpu"]).tensor_parallel_size == 2
    assert ExecutorConfig.from_args(["--device", "cpu"]).tensor_parallel_size == 1
    with pytest.raises(SystemExit):
        ExecutorConfig.from_args(["--tensor-parallel-size", "0"])


def test_what_does_not_split_is_refused_before_any_rank_starts(tmp_path, model_dirs):
    from executor_svc.config import ExecutorConfig
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.parallel.launch import check_splits

    path = model_dirs["tiny-llama"]
    with pytest.raises(ModelError, match="does not divide the 4 attention heads"):
        check_splits(ExecutorConfig(model=str(path), tensor_parallel_size=3), path)
    check_splits(ExecutorConfig(model=str(path), tensor_parallel_size=2, quantization="fp8"), path)  # FP8 splits
    check_splits(ExecutorConfig(model=str(path), tensor_parallel_size=4), path)  # 2 KV heads replicated


def test_four_ranks_share_two_kv_heads(model_dirs):
    """4 ranks, 4 query heads, 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 head 1."""
    assert _compare(model_dirs["tiny-llama"], num_tokens=6, size=4) == [(1, 1, 32, 128)] * 4

