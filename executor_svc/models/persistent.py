"""--persistent-decode: a dense Llama's decode steps of 1..MAX_ROWS rows as one launch of
kernels/persistent_decode.py (every layer, embedding to final norm; issue 27 item 4, docs/kernels.md).
The lm_head and sampling run after it as before. Triton is imported when the step is built (CUDA)."""

from __future__ import annotations

import torch

from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.kv_cache import KVCache


def unsupported(model) -> str | None:
    """Why the persistent step cannot run `model` (models/llama.py LlamaForCausalLM), or None."""
    a = model.args
    d = a.head_dim
    reasons = [
        (model.tp.size > 1, "tensor parallelism"),
        (model.batch_invariant, "--deterministic"),
        (a.qk_norm, "q/k norm (Qwen3)"),
        (a.qkv_bias, "a qkv bias (Qwen2)"),
        (any(a.layer_windows), "sliding-window layers"),
        (d < 16 or d & (d - 1), f"head_dim {d} (a power of two >= 16 only)"),
        (a.num_heads % a.num_kv_heads != 0, "query heads not a multiple of the KV heads"),
        (model.lm_head.weight.dtype not in (torch.float16, torch.bfloat16, torch.float32), "FP8 weights"),
    ]
    for layer in model.layers:
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if not isinstance(lin, torch.nn.Linear) or lin.weight.dtype != model.lm_head.weight.dtype:
                reasons.append((True, "quantized linears"))
                break
    why = [text for bad, text in reasons if bad]
    return ", ".join(why) or None


class PersistentDecode:
    """Runs a decode step of `model` in one launch; applies(...) says when it takes a step (a
    decode step of 1..MAX_ROWS rows, caches in the model's dtype). The layer table is built on the
    first step (the executor's warm-up, before any CUDA graph is captured) and again if the caches
    are reallocated; the barrier counter lives as long as the model."""

    def __init__(self, model):
        why = unsupported(model)
        if why:
            raise ValueError(f"--persistent-decode does not cover this model: {why}")
        from kernels import persistent_decode as kernel

        a = model.args
        self.model, self.kernel = model, kernel
        self.shape = kernel.DecoderShape(a.hidden_size, a.intermediate_size, a.num_layers, a.num_heads,
                                  a.num_kv_heads, a.head_dim)
        self.barrier = torch.zeros(kernel.counters(self.shape), dtype=torch.int32,
                                   device=model.lm_head.weight.device)
        self._table: tuple[tuple[int, ...], torch.Tensor] | None = None

    def applies(self, input_ids: torch.Tensor, attn: AttentionMetadata, kv_caches: list[KVCache]) -> bool:
        return (attn.is_decode and 1 <= input_ids.shape[0] <= self.kernel.MAX_ROWS
                and kv_caches[0].k.dtype == self.model.lm_head.weight.dtype)

    def table(self, kv_caches: list[KVCache]) -> torch.Tensor:
        key = tuple(t.data_ptr() for cache in kv_caches for t in (cache.k, cache.v))  # the weights never move
        if self._table is None or self._table[0] != key:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the persistent decode step's first run must precede CUDA graph capture")
            layers = [(layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight,
                       layer.mlp.down_proj.weight, layer.input_layernorm.weight,
                       layer.post_attention_layernorm.weight, cache.k, cache.v)
                      for layer, cache in zip(self.model.layers, kv_caches)]
            self._table = key, self.kernel.layer_table(layers, self.shape)
        return self._table[1]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                 kv_caches: list[KVCache], staged: bool = False, **launch) -> torch.Tensor:
        """The final hidden states [T, H] (final norm applied), as model.forward returns them.
        launch: the kernel's launch options (num_programs, prefetch, ...: tests and benchmarks)."""
        m = self.model
        return self.kernel.persistent_decode_triton(
            input_ids, positions, attn.slot_mapping, attn.block_tables, attn.seq_lens, m.embed_tokens.weight,
            self.table(kv_caches), m.norm.weight, m.cos_sin_cache, kv_caches[0].k, self.shape, m.args.rms_norm_eps,
            None if staged else self.barrier, staged=staged, **launch)
