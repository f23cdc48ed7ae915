"""Llama-family decoder (Llama, Mistral, Qwen2 with qkv bias, Qwen3 with q/k norm) over a paged KV cache,
with per-layer sliding-window attention (Mistral, Qwen2/Qwen3 layer_types) and rope scaling.

Called as model(input_ids [T], positions [T], attn, kv_caches) -> hidden [T, H]; then
model.compute_logits(hidden [N, H]) -> [N, V] float32. All inputs are explicit arguments.

Tensor parallelism (tp, parallel/state.py): each rank builds its share of every layer (query
and KV heads, MLP rows, vocabulary rows), all-reduces after o_proj and down_proj and gathers
the logits; with TensorParallel() (size 1) nothing of it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from executor_svc.model_loader import checks as model_checks
from executor_svc.models import layers
from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.kv_cache import KVCache
from executor_svc.models.layers import RMSNorm
from executor_svc.parallel.layers import VocabParallelEmbedding, gather_logits
from executor_svc.parallel.state import SINGLE, TensorParallel


@dataclass(frozen=True)
class ModelArgs:
    """The shape of a Llama-family model, read from a transformers config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None = default rope; else e.g. {"rope_type": "yarn", "factor": 4.0, ...}
    max_position_embeddings: int
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3: RMSNorm of each q/k head before rope
    tie_word_embeddings: bool
    layer_windows: tuple[int, ...] = ()  # sliding window of each layer; 0 (or missing) = full
    rope_max_positions: int = 0  # rows of the rotary table; 0 = max_position_embeddings

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelArgs":
        model_type = cfg.model_type  # "llama", "mistral", "qwen2", "qwen3"
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        theta = rope.pop("rope_theta", None) or getattr(cfg, "rope_theta", None) or 10000.0
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = {}
        num_heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        # Qwen2 always has a qkv bias; attention_bias (llama, qwen3: on q, k, v and o) is
        # refused by model_checks, and Mistral's attention ignores it as transformers does.
        qkv_bias = model_type == "qwen2"
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
            num_heads=num_heads, num_kv_heads=getattr(cfg, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
            rope_scaling=rope or None, max_position_embeddings=cfg.max_position_embeddings,
            qkv_bias=qkv_bias, qk_norm=model_type == "qwen3",
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            layer_windows=model_checks.layer_windows(cfg),
            rope_max_positions=model_checks.rope_max_positions(cfg),
        )


class Attention(nn.Module):
    """args: this rank's shape (TensorParallel.rank_args): its query and KV heads.
    batch_invariant (--deterministic): the invariant GEMMs, and every step's attention through
    paged_attention's invariant form, decode steps included (docs/deterministic.md)."""

    def __init__(self, args: ModelArgs, sliding_window: int = 0, tp: TensorParallel = SINGLE,
                 batch_invariant: bool = False):
        super().__init__()
        self.tp, self.batch_invariant = tp, batch_invariant
        linear = layers.InvariantLinear if batch_invariant else nn.Linear
        self.sliding_window = sliding_window or None  # keys q - W < k <= q; None = full
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.scale = args.head_dim ** -0.5
        self.qkv_proj = linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = linear(self.q_size, args.hidden_size, bias=False)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def fuses_rope(self, x: torch.Tensor, kv_cache: KVCache) -> bool:
        """Whether the skinny layer runs input norm + qkv + rope + KV write as one launch
        (layers.rms_norm_qkv_rope, kernels/skinny_rope.py): NeoX rope (this model's), no q/k norm,
        a cache in x's dtype or FP8, head_dim a power of two >= 16. Host facts only."""
        d = self.head_dim
        cache_ok = kv_cache.k.dtype in (x.dtype, torch.float8_e4m3fn)
        return self.q_norm is None and cache_ok and d >= 16 and d & (d - 1) == 0

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_cache: KVCache, cos_sin_cache: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.o_proj(self.attend(self.qkv_proj(x), positions, attn, kv_cache,
                                                          cos_sin_cache)))

    def attend(self, qkv: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
               kv_cache: KVCache, cos_sin_cache: torch.Tensor, pdl: bool = False) -> torch.Tensor:
        """The fused projection qkv [T, q_size + 2 kv_size] -> attention output [T, q_size]
        (before o_proj); writes this step's k and v into the cache. pdl: the decode path's
        kernels as programmatic dependent launches (the skinny decode layer's chain)."""
        k_cache, v_cache, k_scale, v_scale = kv_cache
        # One launch: [Qwen3 q/k norm] + rope on q and k + k, v into the paged cache; q comes back
        # as a new contiguous [T, nh, D] tensor.
        q = layers.rotary_write_kv(
            positions, qkv, cos_sin_cache, k_cache, v_cache, attn.slot_mapping,
            self.num_heads, self.num_kv_heads, self.head_dim,
            q_norm_weight=self.q_norm.weight if self.q_norm is not None else None,
            k_norm_weight=self.k_norm.weight if self.k_norm is not None else None,
            eps=self.q_norm.eps if self.q_norm is not None else 1e-6, k_scale=k_scale, v_scale=v_scale, pdl=pdl,
        )
        return self.attend_rotated(q, attn, kv_cache, pdl)

    def attend_rotated(self, q: torch.Tensor, attn: AttentionMetadata, kv_cache: KVCache,
                       pdl: bool = False) -> torch.Tensor:
        """Rotated q [T, nh, D], this step's k and v already in the cache (attend, or the skinny
        layer's fused layers.rms_norm_qkv_rope) -> attention output [T, q_size]."""
        t = q.shape[0]
        k_cache, v_cache, k_scale, v_scale = kv_cache
        if attn.is_decode and not self.batch_invariant:
            o = layers.paged_decode_attention(q, k_cache, v_cache, attn.block_tables, attn.seq_lens,
                                              self.scale, self.sliding_window, k_scale, v_scale, pdl=pdl)
        else:
            o = layers.paged_attention(q, k_cache, v_cache, attn.block_tables, attn.seq_lens,
                                       attn.query_start_loc, self.scale, attn.max_query_len,
                                       attn.max_seq_len, self.sliding_window, k_scale, v_scale,
                                       batch_invariant=self.batch_invariant)
        return o.reshape(t, self.q_size)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, tp: TensorParallel = SINGLE, batch_invariant: bool = False):
        super().__init__()
        self.tp = tp
        linear = layers.InvariantLinear if batch_invariant else nn.Linear
        self.gate_up_proj = linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x) -> torch.Tensor:
        """x [T, H], or the FP8 activations an FP8 gate_up_proj takes (layers.fp8_input_group)."""
        return self.tp.all_reduce(self.down_proj(layers.silu_and_mul_for(self.down_proj, self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, sliding_window: int = 0, tp: TensorParallel = SINGLE,
                 batch_invariant: bool = False):
        super().__init__()
        self.tp = tp
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, sliding_window, tp, batch_invariant)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args, tp, batch_invariant)

    def forward(self, x, residual, positions, attn, kv_cache, cos_sin_cache, skinny: bool = False,
                pdl: bool = False):
        """x: this layer's input delta [T, H]; residual: the running sum (None at layer 0).
        skinny: run the fused decode path (layers.use_skinny decides it, from host ints), its
        GEMMs as programmatic dependent launches with pdl."""
        if skinny:
            return self._forward_skinny(x, residual, positions, attn, kv_cache, cos_sin_cache, pdl)
        # FP8 w8a8 linears (at this row count, on CUDA) take their input quantized by the norm
        qkv_group = layers.fp8_input_group(self.self_attn.qkv_proj, x)
        if residual is None:
            h, residual = self.input_layernorm(x, quant_group=qkv_group), x
        else:
            h, residual = self.input_layernorm(x, residual, quant_group=qkv_group)
        h = self.self_attn(h, positions, attn, kv_cache, cos_sin_cache)
        h, residual = self.post_attention_layernorm(h, residual, layers.fp8_input_group(self.mlp.gate_up_proj, h))
        return self.mlp(h), residual

    def _forward_skinny(self, x, residual, positions, attn, kv_cache, cos_sin_cache, pdl: bool):
        """The same layer in four skinny GEMM launches (kernels/skinny_gemm.py): each RMSNorm is
        the prologue of the GEMM after it, silu_and_mul the prologue of down_proj; rope and the KV
        write are the qkv GEMM's epilogue where Attention.fuses_rope (kernels/skinny_rope.py).
        FP8 projections (per-tensor / per-channel scales) are read as e4m3 (layers.skinny_weight)."""
        attn_mod, mlp = self.self_attn, self.mlp
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        qkv_w, qkv_b = layers.skinny_weight(attn_mod.qkv_proj), attn_mod.qkv_proj.bias
        if attn_mod.fuses_rope(x, kv_cache):
            q, residual = layers.rms_norm_qkv_rope(
                x, residual, norm1.weight, norm1.eps, qkv_w, qkv_b, positions, cos_sin_cache, kv_cache.k, kv_cache.v,
                attn.slot_mapping, attn_mod.num_heads, attn_mod.num_kv_heads, attn_mod.head_dim,
                kv_cache.k_scale, kv_cache.v_scale, pdl=pdl)
            o = attn_mod.attend_rotated(q, attn, kv_cache, pdl)
        else:
            qkv, residual = layers.rms_norm_linear(x, residual, norm1.weight, norm1.eps, qkv_w, qkv_b, pdl=pdl)
            o = attn_mod.attend(qkv, positions, attn, kv_cache, cos_sin_cache, pdl)
        h = self.tp.all_reduce(layers.skinny_linear(o, layers.skinny_weight(attn_mod.o_proj), attn_mod.o_proj.bias,
                                                    pdl=pdl))
        gate_up, residual = layers.rms_norm_linear(h, residual, norm2.weight, norm2.eps,
                                                   layers.skinny_weight(mlp.gate_up_proj), mlp.gate_up_proj.bias, pdl=pdl)
        return self.tp.all_reduce(layers.silu_mul_linear(gate_up, layers.skinny_weight(mlp.down_proj), pdl=pdl)), residual


class LlamaForCausalLM(nn.Module):
    """Decoder stack + LM head. Parameter names follow transformers, with fused qkv/gate_up.

    skinny_max_tokens: steps of 1..skinny_max_tokens tokens on CUDA (and compute_logits of as
    many rows) run the fused skinny-GEMM decode path; 0 (the default) = off. The loader passes
    --skinny-max-tokens (at most kernels.SKINNY_MAX_M) for dense CUDA models; pdl: their GEMMs as
    programmatic dependent launches (--pdl on a Hopper GPU).

    args: the whole model's shape; cache_args: this rank's (its KV heads: what the KV cache
    holds), args itself without tensor parallelism.

    kv_scales: the checkpoint's FP8 KV-cache scales, (k_scale, v_scale) per layer, or None (set
    by the loader; start-up puts them in the KV caches with --kv-cache-dtype fp8)."""

    kv_scales: list[tuple[float, float]] | None = None
    persistent = None  # models/persistent.py's PersistentDecode with --persistent-decode (set at start-up)

    def __init__(self, args: ModelArgs, tp: TensorParallel = SINGLE, skinny_max_tokens: int = 0,
                 pdl: bool = False, batch_invariant: bool = False):
        super().__init__()
        if batch_invariant and (skinny_max_tokens or tp.size > 1):
            raise ValueError("batch_invariant takes skinny_max_tokens 0 and one rank")
        self.args, self.tp, self.skinny_max_tokens, self.pdl = args, tp, skinny_max_tokens, pdl
        self.batch_invariant = batch_invariant
        self.cache_args = rank_args = tp.rank_args(args)
        if tp.size > 1:
            self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, tp)
        else:
            self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        windows = args.layer_windows or (0,) * args.num_layers
        self.layers = nn.ModuleList(DecoderLayer(rank_args, windows[i], tp, batch_invariant)
                                    for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        linear = layers.InvariantLinear if batch_invariant else nn.Linear
        self.lm_head = linear(args.hidden_size, self.embed_tokens.num_embeddings, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        for module in self.modules():  # --deterministic's GEMMs: dependent launches with --pdl
            if isinstance(module, layers.InvariantLinear):
                module.pdl = pdl
        cache = layers.rope_cos_sin_cache(args.head_dim, args.rope_max_positions or args.max_position_embeddings,
                                          args.rope_theta, args.rope_scaling, args.max_position_embeddings)
        # [max_pos, D] float32; a plain attribute, so that model.to(dtype) leaves it in float32
        self.cos_sin_cache = cache

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[KVCache]) -> torch.Tensor:
        """input_ids, positions: [T] int64 -> hidden states [T, H] (final norm applied)."""
        if self.persistent is not None and self.persistent.applies(input_ids, attn, kv_caches):
            return self.persistent(input_ids, positions, attn, kv_caches)  # --persistent-decode: one launch
        x, residual = self.embed_tokens(input_ids), None
        skinny = layers.use_skinny(x, self.skinny_max_tokens)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, positions, attn, kv_cache, self.cos_sin_cache, skinny, self.pdl)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] float32; with `out` ([N, V], model dtype), writes the
        unconverted logits there instead (CUDA graphs share one output buffer that way)."""
        if self.tp.size > 1:  # this rank's vocabulary rows, then one all-gather
            weight = self.lm_head.weight
            local = (layers.skinny_linear(hidden, weight) if layers.use_skinny(hidden, self.skinny_max_tokens)
                     else torch.matmul(hidden, weight.t()))
            return gather_logits(local, self.tp, self.args.vocab_size, out)
        if layers.use_skinny(hidden, self.skinny_max_tokens):
            logits = layers.skinny_linear(hidden, self.lm_head.weight, out=out, pdl=self.pdl)
            return logits if out is not None else logits.float()
        if out is not None:
            if self.batch_invariant:
                return layers.linear_invariant(hidden, self.lm_head.weight, out=out, pdl=self.pdl)
            return torch.matmul(hidden, self.lm_head.weight.t(), out=out)
        return self.lm_head(hidden).float()
