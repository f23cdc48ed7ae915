"""The vocabulary-parallel pieces of the model: each rank holds rows
[rank * ceil(V/size), ...) of the embedding (and of the LM head, tied or not), the last shard
padded with zero rows. The column / row-parallel projections are plain nn.Linear of the
rank's shape (models/llama.py): q/k/v and gate/up split by output rows, o_proj and down_proj
by input columns followed by one all-reduce each (TensorParallel.all_reduce)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from executor_svc.parallel.state import TensorParallel


class VocabParallelEmbedding(nn.Embedding):
    """nn.Embedding of this rank's vocabulary rows: ids outside them give zeros, and one
    all-reduce sums the ranks' rows (exact: one non-zero term per id)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel):
        rows = tp.vocab_rows(vocab_size)
        super().__init__(rows, hidden_size)
        self.tp, self.start = tp, tp.rank * rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0))


def gather_logits(local: torch.Tensor, tp: TensorParallel, vocab_size: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Every rank's [N, V/size] logits -> [N, V]: float32, or written into `out` ([N, V],
    model dtype: the CUDA graphs' shared output buffer)."""
    full = tp.all_gather_last(local)[:, :vocab_size]
    if out is not None:
        return out.copy_(full)
    return full.float()
