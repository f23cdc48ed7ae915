"""Plain-torch references for every kernel: the specification the Triton kernels are tested against.

KV-cache layout (one pair of tensors per layer):
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
A token at position p of a request lives in block block_table[p // block_size], offset
p % block_size; its slot is block_id * block_size + offset. Block 0 is the null block.
The KV-cache and attention references (FP8 caches included) live in kernels/reference_attention.py
and are re-exported here.
"""

from __future__ import annotations

import torch

from kernels.fp8_weight import float_weight
from kernels.reference_attention import (  # noqa: F401 - re-exported: the references live here by contract
    FP8_MAX,
    dequantize_kv_reference,
    gather_kv_reference,
    paged_attention_reference,
    paged_decode_attention_reference,
    quantize_kv_reference,
    window_start,
    write_kv_reference,
)
from kernels.reference_invariant import (  # noqa: F401 - re-exported likewise
    linear_invariant_reference,
    paged_attention_invariant_reference,
)


def rms_norm_reference(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm, optionally fused with the residual add that precedes it.

    Without residual: returns rmsnorm(x) * weight. With residual: h = x + residual, rounded to
    x's dtype (what an unfused model would hold in memory), and returns (rmsnorm(h) * weight, h),
    h being the next residual. Math in float32, outputs in x's dtype; inputs are not modified.
    """
    if residual is not None:
        h = (x.float() + residual.float()).to(x.dtype)
    else:
        h = x
    hf = h.float()
    inv_rms = torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = (hf * inv_rms * weight.float()).to(x.dtype)
    return out if residual is None else (out, h)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: x [num_tokens, 2 * inter] -> silu(x[:, :inter]) * x[:, inter:], [num_tokens, inter]."""
    inter = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[..., :inter]) * xf[..., inter:]).to(x.dtype)



def skinny_linear_reference(
    x: torch.Tensor,  # [M, K]
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:
    """x @ w^T (+ bias): the product and the bias add in float32, rounded once to x's dtype; w a
    tensor or an Fp8Weight (dequantized in float32)."""
    y = x.float() @ float_weight(w).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def rms_norm_linear_reference(
    x: torch.Tensor,  # [M, K]
    residual: torch.Tensor | None,  # [M, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    w: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_reference then skinny_linear_reference: returns (y [M, N], new residual [M, K]),
    the new residual being x + residual rounded to x's dtype, or x itself when residual is None."""
    if residual is None:
        h, new_residual = rms_norm_reference(x, norm_weight, eps), x
    else:
        h, new_residual = rms_norm_reference(x, norm_weight, eps, residual)
    return skinny_linear_reference(h, w, bias), new_residual


def silu_mul_linear_reference(
    gate_up: torch.Tensor,  # [M, 2I]
    w: torch.Tensor,  # [N, I]
) -> torch.Tensor:
    """silu_and_mul_reference (rounded to the dtype) then skinny_linear_reference: [M, N]."""
    return skinny_linear_reference(silu_and_mul_reference(gate_up), w)

def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    # x: [T, H, D] float32; cos, sin: [T, 1, D/2]
    half = x.shape[-1] // 2
    if is_neox:  # halves: (x[:half], x[half:]) are the pairs
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # GPT-J style: interleaved pairs
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rotary_embedding_reference(
    positions: torch.Tensor,  # [num_tokens] int
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]: cos in the first half, sin in the second
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding over the full head dim, applied IN PLACE to q and k.

    Returns (q, k), the same tensors, for convenience. Math in float32.
    """
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()  # [T, D]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    q.copy_(_rotate(q.float(), cos, sin, is_neox).to(q.dtype))
    k.copy_(_rotate(k.float(), cos, sin, is_neox).to(k.dtype))
    return q, k


def rotary_write_kv_reference(
    positions: torch.Tensor,  # [num_tokens] int
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]: q | k | v heads
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int, negative = skip
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    is_neox: bool = True,
    q_norm_weight: torch.Tensor | None = None,  # [head_dim]: per-head RMSNorm of q before rope
    k_norm_weight: torch.Tensor | None = None,  # [head_dim]: per-head RMSNorm of k before rope
    eps: float = 1e-6,
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only (write_kv_reference)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention prologue of a layer: split the fused qkv, optional per-head RMSNorm of q and
    k, rotary on q and k, k and v written to the paged cache. Returns q [num_tokens, num_heads,
    head_dim], a new contiguous tensor; qkv is not modified. Exactly the unfused references in
    sequence (each rounds its output to qkv's dtype)."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(t, num_heads, head_dim).clone()
    k = k.reshape(t, num_kv_heads, head_dim).clone()
    v = v.reshape(t, num_kv_heads, head_dim)
    if q_norm_weight is not None:
        q = rms_norm_reference(q.reshape(-1, head_dim), q_norm_weight, eps).view_as(q)
    if k_norm_weight is not None:
        k = rms_norm_reference(k.reshape(-1, head_dim), k_norm_weight, eps).view_as(k)
    rotary_embedding_reference(positions, q, k, cos_sin_cache, is_neox)
    write_kv_reference(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


def rms_norm_qkv_rope_reference(
    x: torch.Tensor,  # [M, K]
    residual: torch.Tensor | None,  # [M, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    w: torch.Tensor,  # [(num_heads + 2 * num_kv_heads) * head_dim, K]
    bias: torch.Tensor | None,  # [(num_heads + 2 * num_kv_heads) * head_dim]
    positions: torch.Tensor,  # [M] int
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [M] int, negative = skip
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor | None = None,  # [1] float32: FP8 caches only
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The skinny decode layer's attention prologue: rms_norm_linear_reference (input norm + qkv
    projection, rounded to x's dtype) then rotary_write_kv_reference (NeoX, no q/k norm). Returns
    (q [M, num_heads, head_dim], new residual); writes k and v into the cache."""
    qkv, new_residual = rms_norm_linear_reference(x, residual, norm_weight, eps, w, bias)
    q = rotary_write_kv_reference(positions, qkv, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                  num_heads, num_kv_heads, head_dim, k_scale=k_scale, v_scale=v_scale)
    return q, new_residual


# --- Gumbel-max sampling ---------------------------------------------------------------------
# Noise from a counter-based hash of (seed, position, token index): no torch.Generator, no state,
# so a step replays identically and can live inside a CUDA graph. The hash works on 32-bit
# values held in int64 tensors; every multiplier is below 2**31, so no product overflows int64
# and the result is the same on every device (the Triton kernel does the same math in uint32,
# where wrapping multiplication equals the `& 0xFFFFFFFF` here):
#     mix(x): x ^= x >> 16; x = (x * 0x7FEB352D) mod 2**32; x ^= x >> 15;
#             x = (x * 0x2C1B3C6D) mod 2**32; x ^= x >> 16
#     key  = mix(mix(mix(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ position)   per row
#     bits = mix(mix(key ^ j) + j)                                        per (row, token j)
#     u    = ((bits >> 9) + 0.5) / 2**23     23 random bits, so u < 1 exactly in float32

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """u [N, V] float32 in (0, 1): a pure function of (seed, position, token index)."""
    seed_lo, seed_hi = seeds & _M32, (seeds >> 32) & _M32
    key = _mix32(_mix32(_mix32(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ (positions & _M32))  # [N]
    j = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)  # [V]
    bits = _mix32((_mix32(key[:, None] ^ j[None, :]) + j[None, :]) & _M32)  # [N, V]
    return ((bits >> 9).float() + 0.5) * (1.0 / (1 << 23))


def bitmask_allows(allowed: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, words] int32 token bitmask -> [N, vocab] bool: token j is allowed when bit j % 32 of
    word j // 32 is set (llguidance's layout, structured outputs)."""
    j = torch.arange(vocab, device=allowed.device)
    return ((allowed[:, j // 32] >> (j % 32).to(torch.int32)) & 1).bool()


def gumbel_sample_reference(
    logits: torch.Tensor,  # [N, V] float32 or bfloat16; -inf = never chosen
    temperature: torch.Tensor,  # [N] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [N] int64
    positions: torch.Tensor,  # [N] int64
    allowed: torch.Tensor | None = None,  # [N, ceil(V / 32)] int32 token bitmask (bitmask_allows)
) -> torch.Tensor:
    """Gumbel-max sampling: [N] int64, row r = argmax_j(logits[r, j] / max(T[r], 1e-5) + g) with
    g = -log(-log(u)), u = uniform_noise(seed, position, j); rows with T <= 0 (not > 0) take
    argmax_j logits[r, j]; with `allowed`, over the tokens the row's bitmask allows (the others
    are -inf first). Math in float32; ties go to the lowest index (torch.argmax)."""
    logits = logits.float()
    if allowed is not None:
        logits = logits.masked_fill(~bitmask_allows(allowed, logits.shape[-1]), float("-inf"))
    greedy = logits.argmax(dim=-1)
    scaled = logits / temperature.float().clamp_min(1e-5)[:, None]
    u = uniform_noise(seeds, positions, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(temperature > 0, sampled, greedy)


def rms_norm_lm_head_sample_reference(
    x: torch.Tensor,  # [M, K] the last layer's output (pre-norm)
    residual: torch.Tensor | None,  # [M, K], added before the norm
    norm_weight: torch.Tensor | None,  # [K]; None: x is already normed
    eps: float,
    w: torch.Tensor,  # [V, K]
    temperature: torch.Tensor,  # [M] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [M] int64
    positions: torch.Tensor,  # [M] int64
    allowed: torch.Tensor | None = None,  # [M, ceil(V / 32)] int32 token bitmask
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final norm, the lm_head and Gumbel-max sampling, literally the three references in
    sequence: (ids [M] int64, logits [M, V] in x's dtype)."""
    logits = (skinny_linear_reference(x, w) if norm_weight is None
              else rms_norm_linear_reference(x, residual, norm_weight, eps, w)[0])
    return gumbel_sample_reference(logits, temperature, seeds, positions, allowed), logits
