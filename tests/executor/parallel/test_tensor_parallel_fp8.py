"""FP8 weights on 2 gloo ranks (CPU, float32): per-tensor, per-channel and block-wise
checkpoints and --quantization fp8 give the greedy tokens of one rank and its logits within the
all-reduce's rounding (every rank holds the single-device model's fp8 values and scales,
parallel/shard_fp8.py); checkpoint KV-cache scales with --kv-cache-dtype fp8 through the runner;
a block that a shard boundary splits is refused before any rank starts, and by the loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.checks import ModelError
from executor_svc.parallel.state import TensorParallel
from tests.executor.fp8_files import add_kv_scales, write_fp8_pair
from tests.executor.tp_helpers import model_greedy, run_ranks, single

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 11, 300, 23, 8, 190, 77, 2, 140, 33, 9]
TP_BLOCK = [16, 32]  # on every rank's boundaries: q 32, k/v 16, gate/up 64 rows; o 32, down 64 columns


def _compare(path, quantization: str = "", num_tokens: int = 10) -> None:
    ref_tokens, ref_logits, _ = single(model_greedy, path, PROMPT, num_tokens, quantization)
    for tokens, logits, _ in run_ranks(2, model_greedy, path, PROMPT, num_tokens, quantization):
        np.testing.assert_allclose(np.stack(logits), np.stack(ref_logits), atol=1e-4, rtol=1e-4)
        assert tokens == ref_tokens


@pytest.mark.parametrize("arch, fmt", [("tiny-llama", "fp8-tensor"), ("tiny-qwen2", "ct-channel"),
                                       ("tiny-llama", "ct-tensor"), ("tiny-llama", "fp8-block")])
def test_fp8_checkpoints_on_two_ranks_give_the_tokens_of_one(tmp_path, model_dirs, arch, fmt):
    block = TP_BLOCK if fmt == "fp8-block" else None
    fp8_dir, _ = write_fp8_pair(model_dirs[arch], tmp_path, fmt, block=block)
    _compare(fp8_dir)


def test_quantization_at_load_on_two_ranks_gives_the_tokens_of_one(model_dirs):
    """Row-parallel o_proj/down_proj: scales over the whole row, so each rank's fp8 columns and
    scales are the single-device ones (not its shard's own amax)."""
    _compare(model_dirs["tiny-qwen3"], quantization="fp8")


def test_quantized_shards_are_the_single_device_weights(model_dirs):
    from executor_svc.model_loader.safetensors import load_model

    path = model_dirs["tiny-llama"]
    whole = load_model(path, "cpu", torch.float32, quantization="fp8").layers[0]
    for rank in range(2):  # no collective at load: the ranks' models without a group
        part = load_model(path, "cpu", torch.float32, quantization="fp8", tp=TensorParallel(rank, 2)).layers[0]
        down, ref = part.mlp.down_proj, whole.mlp.down_proj
        assert torch.equal(down.weight_scale, ref.weight_scale)  # [hidden]: over the whole row
        assert torch.equal(down.weight.view(torch.uint8), ref.weight[:, rank * 64:(rank + 1) * 64].view(torch.uint8))
        gate = part.mlp.gate_up_proj.weight_scale[:64]
        assert torch.equal(gate, ref_gate := whole.mlp.gate_up_proj.weight_scale[rank * 64:(rank + 1) * 64]), ref_gate


def _runner_greedy(tp, path, num_tokens: int):
    from executor_svc.parallel.ranks import serve_plans
    from executor_svc.startup.build import build_runner
    from tests.executor.quantization.test_fp8 import greedy

    runner = build_runner(ExecutorConfig(model=str(path), device="cpu", dtype="float32", max_num_seqs=4,
                                         max_num_batched_tokens=128, num_kv_blocks=32, max_model_len=256,
                                         kv_cache_dtype="fp8"), tp)
    if tp.rank != 0:
        return serve_plans(runner)
    tokens = greedy(runner, PROMPT, num_tokens)
    if tp.size > 1:
        runner.close()
    return tokens, runner.model.kv_scales


def test_kv_cache_scales_on_two_ranks(tmp_path, model_dirs):
    """Per-layer K/V scales are one value each: the same on every rank, which holds its KV heads."""
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-channel")
    add_kv_scales(fp8_dir, [(0.02, 0.03), (0.05, 0.01)])
    ref = single(_runner_greedy, fp8_dir, 10)
    got, _ = run_ranks(2, _runner_greedy, fp8_dir, 10)
    assert got == ref and np.allclose(ref[1], [(0.02, 0.03), (0.05, 0.01)])


@pytest.mark.parametrize("block, named", [([16, 48], "o_proj: rank 0's columns [0, 32)"),
                                          ([32, 32], "k_proj: rank 0's rows [0, 16)")])
def test_a_block_split_by_a_shard_is_refused(tmp_path, model_dirs, block, named):
    from executor_svc.model_loader.safetensors import load_model
    from executor_svc.parallel.launch import check_splits

    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "fp8-block", block=block)
    with pytest.raises(ModelError, match="--tensor-parallel-size 2 splits a weight_block_size") as raised:
        check_splits(ExecutorConfig(model=str(fp8_dir), tensor_parallel_size=2), fp8_dir)
    assert named in str(raised.value) and "\n" not in str(raised.value)
    rank = int(named.split("rank ")[1][0])
    with pytest.raises(ModelError, match=named.replace("[", r"\[").replace(")", r"\)")):
        load_model(fp8_dir, "cpu", torch.float32, tp=TensorParallel(rank, 2))
    check_splits(ExecutorConfig(model=str(fp8_dir), tensor_parallel_size=1), fp8_dir)
