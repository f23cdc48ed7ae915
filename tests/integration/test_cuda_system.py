"""The full system on the GPU in bf16 against transformers on the same weights (skipped without CUDA).

Greedy continuations are compared teacher-forced: transformers scores the prompt plus our tokens,
and every token we chose must be transformers' top-1 or within bf16 rounding of it.
"""

import concurrent.futures as cf
import random

import pytest
import torch

from benchmarks.cluster import Cluster, generate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen3", marks=pytest.mark.cuda_slow)])
def test_bf16_system_agrees_with_transformers(arch, model_dirs, tmp_path):
    import transformers

    # a fixed KV cache (tests share the GPU); the decode graphs that 12 requests can take (the
    # default sizes up to 16: the others are never replayed here)
    cluster = Cluster(model_dirs[arch], tmp_path, ["--device", "cuda", "--num-kv-blocks", "4096",
                                                   "--cuda-graph-sizes", "1,2,4,8,16"])
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(4, 60))] for _ in range(12)]
    try:
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(lambda p: generate(cluster.stub, prompt_ids=p, max_tokens=32,
                                                    temperature=0.0, ignore_eos=True)[0], prompts))
        status = cluster.status()
        assert status.num_graph_steps > 0  # decode steps replayed captured graphs
    finally:
        cluster.stop()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dirs[arch], dtype=torch.bfloat16).cuda().eval()
    agree = total = 0
    for prompt, ours in zip(prompts, outs):
        assert len(ours) == 32
        ids = torch.tensor([prompt + ours], device="cuda")
        with torch.no_grad():
            logits = hf(ids).logits[0, len(prompt) - 1:-1].float()  # [32, V]: predicts each of ours
        chosen = logits.gather(1, torch.tensor(ours, device="cuda")[:, None])[:, 0]
        top = logits.max(dim=1).values
        tol = 0.02 * logits.abs().max(dim=1).values + 1e-2  # bf16 keeps ~3 significant digits
        assert bool((chosen >= top - tol).all()), (top - chosen).max().item()
        agree += int((logits.argmax(dim=1) == torch.tensor(ours, device="cuda")).sum())
        total += len(ours)
    assert agree / total >= 0.9
