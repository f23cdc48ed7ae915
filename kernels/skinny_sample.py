"""Final norm + lm_head + Gumbel-max sampling in one pass for decode rows (1..16) that sample plainly.

`rms_norm_lm_head_sample_triton` = `rms_norm_linear_triton` (the model's final RMSNorm, with its
residual add, as the lm_head GEMM's prologue) then `gumbel_sample_triton` over the logits, without
writing the logits (unless asked) or reading them back:

  - `_head_sample_kernel`, grid (cdiv(V, BLOCK_N),): a program computes its BLOCK_N vocabulary
    columns of every row (`_skinny_acc`, the skinny GEMM's loop and PDL wait included), rounds them to the model dtype exactly where the unfused lm_head stores logits,
    scores them as kernels/sampling.py does (logit / max(T, 1e-5) + Gumbel noise of (seed,
    position, token) on rows with T > 0, the plain logit on greedy rows; -inf where a row's
    token bitmask forbids) and writes its (max, lowest index of the max) per row to scratch;
  - `_partials_argmax_kernel`, grid (M,): the row's best partial (lowest column block on ties:
    blocks hold increasing columns), its token id to `out`, and optionally to
    `last_tokens[rows[i]]` (the sampler's last sampled tokens: no separate index_copy).

The same config gives the same logits as the unfused pair, hence the same token ids (tested
bit-exact against `rms_norm_linear_triton` + `gumbel_sample_triton`). Scratch is sized from
shapes; no host sync after tuning: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_skinny_args, check_tensor
from kernels.sampling import _chunk_argmax, _key, gumbel_noise
from kernels.skinny_acc import _skinny_acc
from kernels.skinny_tune import MAX_M, SkinnyConfig, default_config, launch_constants, pick_config

REDUCE_BLOCK = 1024  # partials a lane group of the reduce walks at a time


@triton.jit
def _head_sample_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, temp_ptr, seed_ptr, pos_ptr, mask_ptr, logits_ptr, max_ptr, idx_ptr,
    M, V, num_blocks, stride_x, stride_r, stride_w, stride_m, stride_l, eps,
    K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_MASK: tl.constexpr, WRITE_LOGITS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False, DOT: tl.constexpr = True,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < V
    acc = _skinny_acc(x_ptr, r_ptr, nw_ptr, x_ptr, w_ptr, offs_n, n_mask, 0, pid < 0,  # no residual out
                      M, stride_x, stride_r, 0, stride_w, eps, K, TILES_PER_SPLIT, PROLOGUE, HAS_RESIDUAL,
                      BLOCK_M, BLOCK_N, BLOCK_K, NORM_BLOCK, USE_PDL, DOT)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cell_ok = row_ok[:, None] & n_mask[None, :]
    logits = acc.to(x_ptr.dtype.element_ty)  # what the unfused lm_head stores
    if WRITE_LOGITS:
        tl.store(logits_ptr + rows[:, None] * stride_l + offs_n[None, :], logits, mask=cell_ok)
    x = logits.to(tl.float32)
    temperature = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
    key = _key(tl.load(seed_ptr + rows, mask=row_ok, other=0), tl.load(pos_ptr + rows, mask=row_ok, other=0))
    noisy = tl.math.div_rn(x, tl.maximum(temperature, 1e-5)[:, None]) + gumbel_noise(key[:, None],
                                                                                     offs_n.to(tl.uint32)[None, :])
    score = tl.where(temperature[:, None] > 0, noisy, x)
    if HAS_MASK:
        word = tl.load(mask_ptr + rows[:, None] * stride_m + (offs_n[None, :] >> 5), mask=cell_ok, other=0)
        score = tl.where(((word >> (offs_n[None, :] & 31)) & 1) != 0, score, float("-inf"))
    score = tl.where(n_mask[None, :], score, float("-inf"))
    best = tl.max(score, axis=1)
    # lowest index of the max; an all -inf row: its first column (kernels/sampling.py's rule)
    idx = tl.min(tl.where((score == best[:, None]) & n_mask[None, :], offs_n[None, :], V), axis=1)
    tl.store(max_ptr + rows * num_blocks + pid, best, mask=row_ok)
    tl.store(idx_ptr + rows * num_blocks + pid, idx, mask=row_ok)


@triton.jit
def _partials_argmax_kernel(max_ptr, idx_ptr, out_ptr, rows_ptr, last_ptr, num_blocks,
                            HAS_LAST: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    # the lowest block holding the row's max holds its lowest token index of the max
    _, block = _chunk_argmax(max_ptr + row * num_blocks, max_ptr, 0, num_blocks, num_blocks, 0, 1.0,
                             False, False, BLOCK)
    token = tl.load(idx_ptr + row * num_blocks + block).to(tl.int64)
    tl.store(out_ptr + row, token)
    if HAS_LAST:
        tl.store(last_ptr + tl.load(rows_ptr + row), token)


def head_sample_fits(cfg: SkinnyConfig) -> bool:
    """Usable here: no split-K (the epilogue needs each logit whole)."""
    return cfg.split_k == 1


def rms_norm_lm_head_sample_triton(
    x: torch.Tensor,  # [M, K] the last layer's output (pre-norm), 1 <= M <= 16
    residual: torch.Tensor | None,  # [M, K] the residual stream, added before the norm
    norm_weight: torch.Tensor | None,  # [K] the final norm's weight; None: x is already normed
    eps: float,
    w: torch.Tensor,  # [V, K] the lm_head
    temperature: torch.Tensor,  # [M] float32; <= 0 = greedy
    seeds: torch.Tensor,  # [M] int64
    positions: torch.Tensor,  # [M] int64
    allowed: torch.Tensor | None = None,  # [M, ceil(V / 32)] int32 token bitmask, or None
    logits_out: torch.Tensor | None = None,  # [M, V] in x's dtype: also write the logits there
    rows: torch.Tensor | None = None,  # [M] int64 with last_tokens: also last_tokens[rows[i]] = id i
    last_tokens: torch.Tensor | None = None,  # int64
    config: SkinnyConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """[M] int64 token ids: gumbel_sample of the logits of rms_norm_linear(x, residual) @ w^T."""
    tensors = check_skinny_args(x, w, None, residual, norm_weight, MAX_M)
    m, (vocab, k) = x.shape[0], w.shape
    for name, t, dtype in (("temperature", temperature, torch.float32), ("seeds", seeds, torch.int64),
                           ("positions", positions, torch.int64)):
        check_tensor(name, t, 1, (dtype,))
        if t.shape[0] != m:
            raise ValueError(f"{name} has {t.shape[0]} entries, x has {m} rows")
        tensors[name] = t.contiguous()
    if not 1 <= vocab < 2**31 - 1:
        raise ValueError(f"vocab size must be in [1, 2**31 - 1), got {vocab}")
    if allowed is not None:
        check_tensor("allowed", allowed, 2, (torch.int32,))
        if allowed.shape[0] != m or allowed.shape[1] * 32 < vocab or allowed.stride(1) != 1:
            raise ValueError(f"allowed must be [{m}, >= {triton.cdiv(vocab, 32)}] with contiguous rows, "
                             f"got {tuple(allowed.shape)}")
        tensors["allowed"] = allowed
    if logits_out is not None:
        check_tensor("logits_out", logits_out, 2, (x.dtype,))
        if tuple(logits_out.shape) != (m, vocab):
            raise ValueError(f"logits_out must be {(m, vocab)}, got {tuple(logits_out.shape)}")
        tensors["logits_out"] = logits_out
    if (rows is None) != (last_tokens is None):
        raise ValueError("rows and last_tokens go together")
    if rows is not None:
        check_tensor("rows", rows, 1, (torch.int64,))
        check_tensor("last_tokens", last_tokens, 1, (torch.int64,))
        if rows.shape[0] != m:
            raise ValueError(f"rows has {rows.shape[0]} entries, x has {m} rows")
        tensors.update(rows=rows, last_tokens=last_tokens)
    if config is not None and not head_sample_fits(config):
        raise ValueError(f"{config} does not fit the head-sample kernel: split_k must be 1")
    check_same_device(**tensors)
    temperature, seeds, positions = tensors["temperature"], tensors["seeds"], tensors["positions"]
    out = torch.empty(m, dtype=torch.int64, device=x.device)
    prologue = 0 if norm_weight is None else 1
    r = residual if residual is not None else x
    launch = {"launch_pdl": True} if pdl else {}  # (the interpreter takes no launch_pdl)

    def run(cfg: SkinnyConfig) -> None:
        num_blocks = triton.cdiv(vocab, cfg.block_n)
        best = torch.empty(m, num_blocks, dtype=torch.float32, device=x.device)
        best_idx = torch.empty(m, num_blocks, dtype=torch.int32, device=x.device)
        _head_sample_kernel[(num_blocks,)](
            x, r, norm_weight if norm_weight is not None else x, w, temperature, seeds, positions,
            allowed if allowed is not None else temperature, logits_out if logits_out is not None else x,
            best, best_idx, m, vocab, num_blocks, x.stride(0), r.stride(0), w.stride(0),
            allowed.stride(0) if allowed is not None else 0, logits_out.stride(0) if logits_out is not None else 0,
            eps, PROLOGUE=prologue, HAS_RESIDUAL=residual is not None, HAS_MASK=allowed is not None,
            WRITE_LOGITS=logits_out is not None, USE_PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **launch_constants(cfg, m, k), **launch,
        )
        _partials_argmax_kernel[(m,)](
            best, best_idx, out, rows if rows is not None else out, last_tokens if last_tokens is not None else out,
            num_blocks, HAS_LAST=rows is not None, BLOCK=REDUCE_BLOCK, USE_PDL=pdl, num_warps=4, **launch,
        )

    if config is None:
        key = ("head_sample", prologue, residual is not None, triton.next_power_of_2(m), vocab, k, x.dtype, x.device)
        config = pick_config(key, run, x.is_cuda, m, vocab, k, keep=head_sample_fits,
                             default=default_config(m, vocab, k)._replace(split_k=1))
    run(config)
    return out
