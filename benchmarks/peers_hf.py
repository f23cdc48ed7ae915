"""Hugging Face transformers peers, measured on the same GPU in the same run as llmserve."""

from __future__ import annotations

import time

import torch

from benchmarks.workloads import Workload


def _load(path, attn="sdpa"):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation=attn).cuda().eval()
    model.generation_config.eos_token_id = None  # EOS ignored, as in our workloads
    model.generation_config.pad_token_id = 0
    return model


def _time_generate(model, ids, new_tokens, **kw) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, **kw)
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - t


def w1_generate(path, workload: Workload) -> dict[str, float]:
    """TPOT (ms) of generate() at batch 1, dynamic cache and static cache: (t(n) - t(1)) / (n - 1)."""
    model = _load(path)
    prompt, n = workload[0]
    ids = torch.tensor([prompt], device="cuda")
    results = {}
    for name, kw in [("hf_eager", {}), ("hf_static", {"cache_implementation": "static"})]:
        _time_generate(model, ids, 8, **kw)  # warm-up
        t1 = min(_time_generate(model, ids, 1, **kw) for _ in range(2))
        tn = min(_time_generate(model, ids, n, **kw) for _ in range(2))
        results[name] = 1e3 * (tn - t1) / (n - 1)
    del model
    torch.cuda.empty_cache()
    return results


def continuous_batching(path, workload: Workload, use_cuda_graph: bool | None = None) -> float:
    """Output tokens/s of model.generate_batch (transformers' continuous batching, paged|sdpa)."""
    import transformers
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = _load(path, attn="paged|sdpa")
    new_tokens = workload[0][1]
    assert all(n == new_tokens for _, n in workload), "generate_batch takes one max_new_tokens"
    gen = transformers.GenerationConfig(max_new_tokens=new_tokens,
                                        do_sample=False, eos_token_id=None, pad_token_id=0)
    cb = ContinuousBatchingConfig(use_cuda_graph=use_cuda_graph) if use_cuda_graph is not None else None
    prompts = [p for p, _ in workload]
    model.generate_batch(prompts[:8], generation_config=gen, continuous_batching_config=cb)  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    del model
    torch.cuda.empty_cache()
    return tokens / wall
