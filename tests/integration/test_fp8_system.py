"""FP8 through both services on CPU (the reference paths): `--quantization fp8` and
`--kv-cache-dtype fp8` reach the executor, the scheduler sees the FP8 cache's block count in
the handshake (4x float32's in the same budget), and the greedy tokens streamed over gRPC are
the runner's own FP8 tokens."""

import torch

from benchmarks.cluster import generate
from executor_svc.model_loader.safetensors import load_model
from executor_svc.startup import kv_cache
from tests.executor.conftest import make_runner
from tests.executor.models.test_sliding_window import runner_greedy
from tests.integration.conftest import start_cluster

PROMPT, MAX_TOKENS = [7, 70, 170, 9, 99, 3, 33], 12
GIB = 0.01
BUDGET = ["--cpu-kv-cache-gib", str(GIB)]  # the same budget for both clusters


def test_fp8_weights_and_kv_cache_through_both_services(model_dirs, tmp_path_factory):
    path = model_dirs["llama"]
    want = runner_greedy(make_runner(path, quantization="fp8", kv_cache_dtype="fp8"), PROMPT, MAX_TOKENS)
    dense = start_cluster(tmp_path_factory, path, "dense", BUDGET)
    fp8 = start_cluster(tmp_path_factory, path, "fp8", [*BUDGET, "--quantization", "fp8", "--kv-cache-dtype", "fp8"])
    try:
        args, budget = load_model(path, "cpu", torch.float32).args, int(GIB * (1 << 30))
        blocks = {dtype: kv_cache.num_blocks_from_budget(budget, args, 16, dtype) - 1  # the null block
                  for dtype in (torch.float32, torch.float8_e4m3fn)}
        assert dense.status().total_blocks == blocks[torch.float32]
        assert fp8.status().total_blocks == blocks[torch.float8_e4m3fn]
        assert 4 * blocks[torch.float32] <= blocks[torch.float8_e4m3fn] < 4 * blocks[torch.float32] + 8
        got = generate(fp8.stub, prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)[0]
        assert got == want
    finally:
        dense.stop()
        fp8.stop()
