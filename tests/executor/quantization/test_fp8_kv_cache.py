"""--kv-cache-dtype fp8 on CPU (the references): the cache dtype and scales, exactly twice the blocks
of a bf16 cache in the same budget (four times fp32's), refused values, and a tiny random model
whose outputs over an FP8 cache stay close to the same model over its fp32 cache."""

from __future__ import annotations

import pytest
import torch

from benchmarks.fp8_accuracy import teacher_forced_logits
from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.safetensors import load_model
from executor_svc.startup import kv_cache
from tests.executor.conftest import make_runner
from tests.executor.models.test_sliding_window import runner_greedy

FP8 = torch.float8_e4m3fn
PROMPT = list(range(5, 45))
NUM_TOKENS = 24
# Measured on the four tiny random models (seeded; scales 1.0, so many of their small K/V values
# are e4m3 subnormals): teacher-forced top-1 agreement 0.875 (llama, mistral), 0.92 (qwen2),
# 0.97 (qwen3) over the 64 positions; per-position logits cosine min 0.991-0.996, mean 0.998-0.999.
# Free-running greedy runs diverge after the first differing token (9 to 24 of 24 equal), so
# they are not compared beyond the first token.
MIN_AGREEMENT, MIN_COSINE, MIN_MEAN_COSINE = 0.8, 0.985, 0.995


@pytest.mark.parametrize("dtype,ratio", [("bfloat16", 2), ("float32", 4)])
def test_fp8_doubles_the_blocks_of_a_bf16_cache_in_the_same_budget(model_dirs, dtype, ratio):
    path = model_dirs["tiny-llama"]
    args = load_model(path, "cpu", torch.float32).args
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    per_block = 2 * args.num_layers * 16 * args.num_kv_heads * args.head_dim * elem  # K and V, every layer
    assert kv_cache.block_bytes(args, 16, getattr(torch, dtype)) == per_block
    budget_gib = 100 * per_block / (1 << 30)  # exactly 100 blocks of the model dtype
    auto = make_runner(path, dtype=dtype, num_kv_blocks=0, cpu_kv_cache_gib=budget_gib)
    fp8 = make_runner(path, dtype=dtype, num_kv_blocks=0, cpu_kv_cache_gib=budget_gib, kv_cache_dtype="fp8")
    assert auto.info().num_blocks == 100 and fp8.info().num_blocks == 100 * ratio
    assert auto.kv_caches[0].k.dtype == getattr(torch, dtype)
    for cache in fp8.kv_caches:
        assert cache.k.dtype == cache.v.dtype == FP8 and cache.k.shape[0] == 100 * ratio
        assert cache.k_scale.dtype == torch.float32 and cache.k_scale.tolist() == [1.0] == cache.v_scale.tolist()
    assert sum(c.k.numel() * c.k.element_size() * 2 for c in fp8.kv_caches) == 100 * per_block


@pytest.mark.parametrize("value", ["fp8_e5m2", "int8", "bfloat16", "fp16", ""])
def test_bad_kv_cache_dtypes_are_refused_at_parse_time(value, capsys):
    with pytest.raises(SystemExit):
        ExecutorConfig.from_args(["--kv-cache-dtype", value, "--device", "cpu"])
    err = capsys.readouterr().err
    assert "--kv-cache-dtype" in err
    assert ("e4m3" in err) if value == "fp8_e5m2" else ("auto, fp8 or fp8_e4m3" in err)


def test_kv_cache_dtype_values_and_default(monkeypatch):
    assert ExecutorConfig.from_args(["--device", "cpu"]).kv_cache_dtype == "auto"
    assert ExecutorConfig().kv_cache_dtype == "auto"
    for value, want in [("fp8", "fp8"), ("fp8_e4m3", "fp8"), ("FP8", "fp8"), ("auto", "auto")]:
        assert ExecutorConfig.from_args(["--kv-cache-dtype", value, "--device", "cpu"]).kv_cache_dtype == want
    monkeypatch.setenv("LLMSERVE_EXECUTOR_KV_CACHE_DTYPE", "fp8_e4m3")
    assert ExecutorConfig.from_args(["--device", "cpu"]).kv_cache_dtype == "fp8"


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"])
def test_fp8_cache_outputs_stay_close_to_the_fp32_cache(model_dirs, arch):
    path = model_dirs[arch]
    runner = make_runner(path)
    tokens = runner_greedy(runner, PROMPT, NUM_TOKENS)
    fp8_runner = make_runner(path, kv_cache_dtype="fp8")
    assert fp8_runner.kv_caches[0].k.dtype == FP8
    fp8_tokens = runner_greedy(fp8_runner, PROMPT, NUM_TOKENS)
    assert len(fp8_tokens) == NUM_TOKENS and fp8_tokens[0] == tokens[0]
    # teacher-forced on the fp32 cache's greedy continuation: prefill positions and decode steps
    model = runner.model
    full = PROMPT + tokens
    want = teacher_forced_logits(model, torch.float32, full, len(PROMPT))
    got = teacher_forced_logits(model, FP8, full, len(PROMPT))
    assert torch.equal(want[len(PROMPT) - 1:-1].argmax(-1), torch.tensor(tokens)), "teacher forcing is off"
    agreement = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    cosine = torch.nn.functional.cosine_similarity(want, got, dim=-1)
    assert agreement >= MIN_AGREEMENT and cosine.min().item() > MIN_COSINE, (agreement, cosine.min().item())
    assert cosine.mean().item() > MIN_MEAN_COSINE
    assert not torch.equal(want, got), "the FP8 cache changed nothing: is it used?"
    # the runner's FP8 greedy run is exactly the model's over an FP8 cache (plumbing: dtype, scales)
    got8 = teacher_forced_logits(model, FP8, PROMPT + fp8_tokens, len(PROMPT))
    assert torch.equal(got8[len(PROMPT) - 1:-1].argmax(-1), torch.tensor(fp8_tokens))
