"""Compute kernels: Triton on CUDA tensors, the plain-torch references (kernels/reference.py) otherwise.

Triton is imported only when a CUDA tensor arrives, so `import kernels` works on a machine
without triton. The references are the specification; docs/kernels.md describes each kernel.
"""

from __future__ import annotations

import torch

from kernels import reference
from kernels.invariant import linear_invariant  # noqa: F401 - public (--deterministic)
from kernels.step_ops import TOKEN_ROWS_MAX_DRAFTS, decode_advance, verify_scan, verify_token_rows

__all__ = [  # the public kernels
    "write_kv", "paged_attention", "paged_decode_attention", "rms_norm", "silu_and_mul", "rotary_embedding",
    "gumbel_sample", "rotary_write_kv", "skinny_linear", "rms_norm_linear", "rms_norm_qkv_rope",
    "silu_mul_linear", "SKINNY_MAX_M", "fp8_linear", "FP8_W8A16_MAX_M", "rms_norm_quant",
    "silu_and_mul_quant", "verify_scan", "verify_token_rows", "TOKEN_ROWS_MAX_DRAFTS",
    "decode_advance", "rms_norm_lm_head_sample", "linear_invariant",
]

SKINNY_MAX_M = 16  # the most rows the skinny GEMMs take (kernels/skinny_gemm.py MAX_M)


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int; slot < 0 is skipped
    k_scale: torch.Tensor | None = None,  # [1] float32 on the cache's device: FP8 caches only (needed there)
    v_scale: torch.Tensor | None = None,
) -> None:
    """Writes each token's key and value into its slot of the paged cache, in place (an FP8 cache
    stores clamp(x / scale, -448, 448) in e4m3; other caches ignore the scales)."""
    if key.is_cuda:
        from kernels.cache import write_kv_triton

        return write_kv_triton(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return reference.write_kv_reference(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length after this step (0 = padded row)
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    max_query_len: int,  # host upper bound of the per-request query lengths
    max_seq_len: int,  # host upper bound of seq_lens (unused by the kernels; kept by contract)
    sliding_window: int | None = None,  # host int per layer: keys q - W < k <= q; None / 0 = full
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (read value = fp8 * scale)
    v_scale: torch.Tensor | None = None,
    batch_invariant: bool = False,  # a token's output independent of the step's other tokens
) -> torch.Tensor:
    """Varlen causal attention over the paged cache: prefill, chunked prefill, decode, mixed;
    batch_invariant: a token's output independent of the step's others (docs/deterministic.md)."""
    if q.is_cuda:
        from kernels.attention_prefill import paged_attention_triton

        return paged_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len,
            sliding_window=sliding_window, k_scale=k_scale, v_scale=v_scale, batch_invariant=batch_invariant,
        )
    attend = reference.paged_attention_invariant_reference if batch_invariant else reference.paged_attention_reference
    return attend(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, sliding_window, k_scale, v_scale)


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim], one token per row
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32 (0 = padded row, output zeros)
    scale: float,
    sliding_window: int | None = None,  # host int per layer: keys q - W < k <= q; None / 0 = full
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (read value = fp8 * scale)
    v_scale: torch.Tensor | None = None,
    pdl: bool = False,  # CUDA: programmatic dependent launches (compute capability 9.0+)
) -> torch.Tensor:
    """Decode attention, one query token per row; CUDA-graph capturable on the Triton path."""
    if q.is_cuda:
        from kernels.attention_decode import paged_decode_attention_triton

        return paged_decode_attention_triton(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                             sliding_window=sliding_window, k_scale=k_scale, v_scale=v_scale,
                                             pdl=pdl)
    return reference.paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                                      sliding_window, k_scale, v_scale)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm; with residual, fused h = x + residual first and returns (norm(h) * weight, h)."""
    if x.is_cuda:
        from kernels.norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return reference.rms_norm_reference(x, weight, eps, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * inter] -> silu(x[:, :inter]) * x[:, inter:], [num_tokens, inter]."""
    if x.is_cuda:
        from kernels.activation import silu_and_mul_triton

        return silu_and_mul_triton(x)
    return reference.silu_and_mul_reference(x)


def rotary_embedding(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]: cos | sin halves
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding applied IN PLACE to q and k (views are fine); returns (q, k)."""
    if q.is_cuda:
        from kernels.rotary import rotary_embedding_triton

        return rotary_embedding_triton(positions, q, k, cos_sin_cache, is_neox)
    return reference.rotary_embedding_reference(positions, q, k, cos_sin_cache, is_neox)


def rotary_write_kv(
    positions: torch.Tensor,  # [num_tokens] int
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], the fused projection
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]: cos | sin halves
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int; slot < 0 is skipped
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    is_neox: bool = True,
    q_norm_weight: torch.Tensor | None = None,  # [head_dim], Qwen3 q_norm
    k_norm_weight: torch.Tensor | None = None,  # [head_dim], Qwen3 k_norm
    eps: float = 1e-6,
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (as write_kv)
    v_scale: torch.Tensor | None = None,
    pdl: bool = False,  # CUDA: a programmatic dependent launch (compute capability 9.0+)
) -> torch.Tensor:
    """[q/k per-head RMSNorm] + rotary + write_kv in one launch; returns a new q [num_tokens, num_heads, head_dim]."""
    args = (positions, qkv, cos_sin_cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
            head_dim, is_neox, q_norm_weight, k_norm_weight, eps)
    if qkv.is_cuda:
        from kernels.rotary_cache import rotary_write_kv_triton

        return rotary_write_kv_triton(*args, k_scale=k_scale, v_scale=v_scale, pdl=pdl)
    return reference.rotary_write_kv_reference(*args, k_scale=k_scale, v_scale=v_scale)


def gumbel_sample(
    logits: torch.Tensor,  # [N, V] float32 | bfloat16; -inf entries are never chosen
    temperature: torch.Tensor,  # [N] float32; <= 0 = greedy (plain argmax)
    seeds: torch.Tensor,  # [N] int64
    positions: torch.Tensor,  # [N] int64
    allowed: torch.Tensor | None = None,  # [N, ceil(V / 32)] int32: a token bitmask per row (None: all)
) -> torch.Tensor:
    """Gumbel-max sampling, [N] int64: argmax_j(logits / max(T, 1e-5) + g(seed, position, j)),
    over the tokens each row's bitmask allows (bit j % 32 of word j // 32)."""
    if logits.is_cuda:
        from kernels.sampling import gumbel_sample_triton

        return gumbel_sample_triton(logits, temperature, seeds, positions, allowed)
    return reference.gumbel_sample_reference(logits, temperature, seeds, positions, allowed)


def skinny_linear(
    x: torch.Tensor,  # [M, K], M <= SKINNY_MAX_M on CUDA
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    out: torch.Tensor | None = None,  # [M, N] in x's dtype
    pdl: bool = False,  # CUDA: a programmatic dependent launch (compute capability 9.0+)
) -> torch.Tensor:
    """x @ w^T (+ bias) in x's dtype, fp32 accumulation; the weight-read-bound decode GEMM."""
    if x.is_cuda:
        from kernels.skinny_gemm import skinny_linear_triton

        return skinny_linear_triton(x, w, bias, out, pdl=pdl)
    y = reference.skinny_linear_reference(x, w, bias)
    return y if out is None else out.copy_(y)


def rms_norm_linear(
    x: torch.Tensor,  # [M, K]
    residual: torch.Tensor | None,  # [M, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x [+ residual]) * norm_weight) @ w^T (+ bias) -> (y [M, N], new residual)."""
    if x.is_cuda:
        from kernels.skinny_gemm import rms_norm_linear_triton

        return rms_norm_linear_triton(x, residual, norm_weight, eps, w, bias, pdl=pdl)
    return reference.rms_norm_linear_reference(x, residual, norm_weight, eps, w, bias)


def rms_norm_qkv_rope(x, residual, norm_weight, eps, w, bias, positions, cos_sin_cache, k_cache, v_cache,
                      slot_mapping, num_heads: int, num_kv_heads: int, head_dim: int, k_scale=None, v_scale=None,
                      pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_linear (the qkv projection) then rotary_write_kv (NeoX, no q/k norm, a cache in x's
    dtype or FP8 with its scales), one launch on CUDA (kernels/skinny_rope.py): (q [M, nh, D], new residual)."""
    args = (x, residual, norm_weight, eps, w, bias, positions, cos_sin_cache, k_cache, v_cache, slot_mapping,
            num_heads, num_kv_heads, head_dim, k_scale, v_scale)
    if x.is_cuda:
        from kernels.skinny_rope import rms_norm_qkv_rope_triton

        return rms_norm_qkv_rope_triton(*args, pdl=pdl)
    return reference.rms_norm_qkv_rope_reference(*args)


def silu_mul_linear(gate_up: torch.Tensor, w: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """(silu(gate_up[:, :I]) * gate_up[:, I:]) @ w [N, I]^T -> [M, N] in gate_up's dtype."""
    if gate_up.is_cuda:
        from kernels.skinny_gemm import silu_mul_linear_triton

        return silu_mul_linear_triton(gate_up, w, pdl=pdl)
    return reference.silu_mul_linear_reference(gate_up, w)


FP8_W8A16_MAX_M = 64  # the most rows the weight-only FP8 GEMM takes (kernels/fp8_gemm.py W8A16_MAX_M)


def fp8_linear(
    x,  # [..., K] in the compute dtype, or an Fp8Activation (rms_norm_quant / silu_and_mul_quant)
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    weight_scale: torch.Tensor,  # float32: "tensor" [1], "channel" [N], "block" [ceil(N/bn), ceil(K/bk)]
    strategy: str,  # "tensor" | "channel" | "block"
    block: tuple[int, int] | None = None,  # (bn, bk) for "block"
    bias: torch.Tensor | None = None,  # [N]
    path: str = "auto",  # "auto" | "w8a16" | "w8a8" | "dequantize" (CPU: "w8a8" or the w8a16 reference)
) -> torch.Tensor:
    """x @ (fp8 weight * scales)^T (+ bias) in x's dtype. CUDA: weight-only FP8 GEMM for <= 64 rows,
    dynamic-activation FP8 tensor-core GEMM beyond (kernels/fp8_gemm.py); CPU: the w8a16 reference.
    An Fp8Activation (already quantized) takes the w8a8 GEMM / reference."""
    from kernels import fp8_reference

    if weight.is_cuda:
        from kernels.fp8_gemm import fp8_linear_triton

        return fp8_linear_triton(x, weight, weight_scale, strategy, block, bias, path)
    if isinstance(x, fp8_reference.Fp8Activation):
        return fp8_reference.w8a8_quantized_linear_reference(x, weight, weight_scale, strategy, block, bias)
    ref = fp8_reference.w8a8_linear_reference if path == "w8a8" else fp8_reference.w8a16_linear_reference
    y = ref(x.reshape(-1, x.shape[-1]), weight, weight_scale, strategy, block, bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                   group_size: int | None = None):
    """rms_norm emitting the FP8 w8a8 GEMM's input, an Fp8Activation (per-row scales, or per
    group_size columns), plus the new residual with residual (kernels/fp8_fused.py)."""
    if x.is_cuda:
        from kernels.fp8_fused import rms_norm_quant_triton

        return rms_norm_quant_triton(x, weight, eps, residual, group_size)
    from kernels.fp8_reference import rms_norm_quant_reference

    return rms_norm_quant_reference(x, weight, eps, residual, group_size)


def silu_and_mul_quant(x: torch.Tensor, group_size: int | None = None):
    """silu_and_mul emitting an Fp8Activation of [T, I] (kernels/fp8_fused.py)."""
    if x.is_cuda:
        from kernels.fp8_fused import silu_and_mul_quant_triton

        return silu_and_mul_quant_triton(x, group_size)
    from kernels.fp8_reference import silu_and_mul_quant_reference

    return silu_and_mul_quant_reference(x, group_size)


def rms_norm_lm_head_sample(x, residual, norm_weight, eps, w, temperature, seeds, positions, allowed=None,
                            rows=None, last_tokens=None, pdl: bool = False) -> torch.Tensor:
    """The final norm (with its residual add; norm_weight None: x is normed), the lm_head and
    gumbel_sample in one pass (CUDA: kernels/skinny_sample.py, 1..SKINNY_MAX_M rows): [M] int64
    ids; with rows and last_tokens, also last_tokens[rows[i]] = id i."""
    if x.is_cuda:
        from kernels.skinny_sample import rms_norm_lm_head_sample_triton

        return rms_norm_lm_head_sample_triton(x, residual, norm_weight, eps, w, temperature, seeds, positions,
                                              allowed, rows=rows, last_tokens=last_tokens, pdl=pdl)
    ids = reference.rms_norm_lm_head_sample_reference(x, residual, norm_weight, eps, w, temperature, seeds,
                                                      positions, allowed)[0]
    if rows is not None:
        last_tokens.index_copy_(0, rows, ids)
    return ids
