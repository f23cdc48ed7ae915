"""This rank's slice of each checkpoint tensor (the loader copies it into the rank's fused
parameters, so that qkv_proj holds [q_r, k_r, v_r] and gate_up_proj [gate_r, up_r]).

- q_proj (and its bias): the rows of the rank's query heads; k_proj / v_proj: its KV heads
  (the one head it shares with other ranks when KV heads are replicated);
- gate_proj / up_proj: rows [rank * I/size, ...); o_proj / down_proj: the same columns;
- embed_tokens / lm_head: vocabulary rows [rank * ceil(V/size), ...), zero-padded;
- everything else (norms, Qwen3's per-head q/k norms): whole, on every rank."""

from __future__ import annotations

import torch

from executor_svc.parallel.state import TensorParallel


def fused_bounds(args, tp: TensorParallel) -> dict[str, list[int]]:
    """Row bounds of the parts of this rank's fused weights: q|k|v in qkv_proj, gate|up in gate_up_proj."""
    r = tp.rank_args(args)
    q, kv, inter = r.num_heads * r.head_dim, r.num_kv_heads * r.head_dim, r.intermediate_size
    return {"qkv_proj": [0, q, q + kv, q + 2 * kv], "gate_up_proj": [0, inter, 2 * inter]}


def shard_slice(name: str, part: int | None, args, tp: TensorParallel) -> tuple[int, int, int, int] | None:
    """(dim, start, stop, full length) of the rank's slice of a projection's checkpoint tensor
    (dim 0: output rows of qkv/gate_up parts, dim 1: input columns of o_proj/down_proj); None
    for the other tensors."""
    leaf = name.rsplit(".", 2)
    module = leaf[-2] if len(leaf) >= 2 else ""
    d = args.head_dim
    if module == "qkv_proj":
        if part == 0:
            n = tp.split(args.num_heads, "attention heads") * d
            return 0, tp.rank * n, (tp.rank + 1) * n, args.num_heads * d
        n, start = tp.kv_heads(args.num_kv_heads), tp.kv_head_start(args.num_kv_heads)
        return 0, start * d, (start + n) * d, args.num_kv_heads * d
    if module in ("gate_up_proj", "down_proj"):
        n = tp.split(args.intermediate_size, "MLP rows")
        return int(module == "down_proj"), tp.rank * n, (tp.rank + 1) * n, args.intermediate_size
    if module == "o_proj":
        n = tp.split(args.num_heads, "attention heads") * d
        return 1, tp.rank * n, (tp.rank + 1) * n, args.num_heads * d
    return None


def shard_tensor(name: str, part: int | None, tensor: torch.Tensor, args, tp: TensorParallel) -> torch.Tensor:
    """The rank's slice of the checkpoint tensor loaded into our parameter `name` (part: its
    index in a fused parameter, or None)."""
    if tp.size == 1:
        return tensor
    bounds = shard_slice(name, part, args, tp)
    if bounds is not None:
        dim, start, stop, _ = bounds
        return tensor[start:stop] if dim == 0 else tensor[:, start:stop]
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows = tp.vocab_rows(args.vocab_size)
        piece = tensor[tp.rank * rows:(tp.rank + 1) * rows]
        if piece.shape[0] < rows:  # the last shard: zero rows up to the shard size
            piece = torch.cat([piece, piece.new_zeros(rows - piece.shape[0], *piece.shape[1:])])
        return piece
    return tensor
