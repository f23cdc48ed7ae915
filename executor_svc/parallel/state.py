"""TensorParallel: which rank of how many this process is, and its process groups. Passed
explicitly to the model, the loader and the runner; nothing here is global beyond what
torch.distributed itself keeps. TensorParallel() (size 1) is the single-device path: every
collective is a no-op and every shape the full one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


class ParallelError(ValueError):
    """A model shape that cannot be split over the ranks (one line, for the user)."""


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the forward's collectives (NCCL on CUDA, gloo on CPU)
    cpu_group: Any = None  # gloo: step plans, block counts (the same as group on CPU)

    # ---- shapes ----------------------------------------------------------------------------

    def split(self, n: int, what: str) -> int:
        """n // size; ParallelError when size does not divide n."""
        if n % self.size:
            raise ParallelError(f"--tensor-parallel-size {self.size} does not divide the {n} {what}")
        return n // self.size

    def kv_heads(self, num_kv_heads: int) -> int:
        """KV heads of this rank: an equal share, or 1 (replicated) when there are fewer KV
        heads than ranks (then size must be a multiple of num_kv_heads)."""
        if num_kv_heads >= self.size:
            return self.split(num_kv_heads, "KV heads")
        if self.size % num_kv_heads:
            raise ParallelError(f"--tensor-parallel-size {self.size} is not a multiple of the "
                                f"{num_kv_heads} KV heads (each would be replicated unevenly)")
        return 1

    def kv_head_start(self, num_kv_heads: int) -> int:
        """The first (global) KV head this rank holds; with replication, the head its query
        heads read (rank r of size/n ranks sharing head r // (size/n))."""
        if num_kv_heads >= self.size:
            return self.rank * self.kv_heads(num_kv_heads)
        return self.rank // (self.size // num_kv_heads)

    def vocab_rows(self, vocab_size: int) -> int:
        """Rows of this rank's embedding / LM-head shard: ceil(V / size) (the last is padded)."""
        return -(-vocab_size // self.size)

    def rank_args(self, args):
        """The ModelArgs of this rank's decoder layers and KV cache: its query / KV heads and
        its share of the MLP; vocab_size stays the full one (logits are gathered)."""
        if self.size == 1:
            return args
        self.split(args.num_heads, "attention heads")
        return dataclasses.replace(args, num_heads=args.num_heads // self.size,
                                   num_kv_heads=self.kv_heads(args.num_kv_heads),
                                   intermediate_size=self.split(args.intermediate_size, "MLP rows"))

    # ---- collectives (no host sync: CUDA graphs capture them) --------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; x itself with size 1."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] of every rank -> [..., size * n], rank order."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x, in place."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast(x, src=0, group=self.group)
        return x

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's value (the KV block count of the handshake)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())


SINGLE = TensorParallel()
