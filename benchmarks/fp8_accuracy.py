"""FP8 accuracy against the bf16 model on the same weights (issue 13 part 3).

    python -m benchmarks.fp8_accuracy [--json OUT] [--shapes llama-1b,qwen3-0.6b]

For each shape (random bf16 weights, benchmarks/harness.model_path) and each FP8 variant —
weights quantized at load (`--quantization fp8`, per-channel e4m3), the KV cache in e4m3
(`--kv-cache-dtype fp8`, scales 1.0), and both — the same seeded token sequences are run
teacher-forced through the model directly: the prompt in one prefill step (M = prompt tokens:
the FP8 tensor-core GEMM path), then one decode step per further token (M = 1: the weight-only
path), logits of every position compared with the bf16 model's over a bf16 cache:
cosine similarity (mean, min), KL(bf16 || fp8) (mean, nats) and top-1 agreement.
"""

from __future__ import annotations

import argparse
import json

import torch

from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.startup import kv_cache

VARIANTS = {"fp8 weights": ("fp8", False), "fp8 kv cache": ("", True), "fp8 weights + kv": ("fp8", True)}


def _meta(positions: list[int], seq_len: int, block_ids: list[int], block_size: int, decode: bool,
          device) -> AttentionMetadata:
    table = torch.tensor([block_ids], dtype=torch.int32, device=device)
    pos = torch.tensor(positions, device=device)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    return AttentionMetadata(slot_mapping=slots, block_tables=table,
                             seq_lens=torch.tensor([seq_len], dtype=torch.int32, device=device),
                             query_start_loc=torch.tensor([0, len(positions)], dtype=torch.int32, device=device),
                             max_query_len=len(positions), max_seq_len=seq_len, is_decode=decode)


@torch.inference_mode()
def teacher_forced_logits(model, cache_dtype: torch.dtype, tokens: list[int], prompt_len: int,
                          device="cpu", block_size: int = 16) -> torch.Tensor:
    """Logits [len(tokens), V] float32: the prompt in one prefill step, then one decode step per
    token, over a fresh paged cache of cache_dtype (scales 1.0)."""
    device = torch.device(device)
    blocks = list(range(1, 1 + -(-len(tokens) // block_size)))
    caches = kv_cache.allocate_kv_caches(model.args, len(blocks) + 1, block_size, cache_dtype, device)
    ids = torch.tensor(tokens, device=device)
    hidden = model(ids[:prompt_len], torch.arange(prompt_len, device=device),
                   _meta(list(range(prompt_len)), prompt_len, blocks, block_size, False, device), caches)
    rows = [model.compute_logits(hidden)]
    for p in range(prompt_len, len(tokens)):
        hidden = model(ids[p:p + 1], torch.tensor([p], device=device),
                       _meta([p], p + 1, blocks, block_size, True, device), caches)
        rows.append(model.compute_logits(hidden))
    return torch.cat(rows).float()


def compare(want: torch.Tensor, got: torch.Tensor) -> dict:
    """Per-position agreement of two [P, V] logits tensors."""
    cosine = torch.nn.functional.cosine_similarity(want, got, dim=-1)
    log_p, log_q = want.log_softmax(-1), got.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return dict(positions=want.shape[0], cosine_mean=cosine.mean().item(), cosine_min=cosine.min().item(),
                kl_mean=kl.mean().item(), kl_max=kl.max().item(),
                top1=(want.argmax(-1) == got.argmax(-1)).float().mean().item())


def measure(folder, sequences: int = 4, prompt_len: int = 256, decode_len: int = 64, device="cuda") -> dict:
    """The three FP8 variants of one model folder against its bf16 model."""
    gen = torch.Generator().manual_seed(0)
    dense = load_model(folder, device, torch.bfloat16)
    vocab = dense.args.vocab_size
    seqs = [torch.randint(3, vocab, (prompt_len + decode_len,), generator=gen).tolist() for _ in range(sequences)]
    want = [teacher_forced_logits(dense, torch.bfloat16, s, prompt_len, device) for s in seqs]
    out = {}
    fp8_model = None
    for name, (quant, fp8_kv) in VARIANTS.items():
        if quant and fp8_model is None:
            fp8_model = load_model(folder, device, torch.bfloat16, quantization="fp8")
        model = fp8_model if quant else dense
        cache = torch.float8_e4m3fn if fp8_kv else torch.bfloat16
        got = [teacher_forced_logits(model, cache, s, prompt_len, device) for s in seqs]
        prefill = compare(torch.cat([w[:prompt_len] for w in want]), torch.cat([g[:prompt_len] for g in got]))
        decode = compare(torch.cat([w[prompt_len:] for w in want]), torch.cat([g[prompt_len:] for g in got]))
        out[name] = dict(prefill=prefill, decode=decode)
        print(f"{name:18s} prefill {_fmt(prefill)} | decode {_fmt(decode)}", flush=True)
    return out


def _fmt(r: dict) -> str:
    return (f"cos {r['cosine_mean']:.5f} (min {r['cosine_min']:.4f}) KL {r['kl_mean']:.2e} "
            f"top-1 {r['top1']:.3f}")


def main() -> None:
    from benchmarks.harness import model_path

    p = argparse.ArgumentParser()
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--shapes", default="llama-1b,qwen3-0.6b")
    args = p.parse_args()
    out = {}
    for shape in args.shapes.split(","):
        print(f"== {shape}", flush=True)
        out[shape] = measure(model_path(shape))
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
