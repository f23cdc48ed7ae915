"""A greedy verify step's tail: one argmax and one kernel, captured per decode size.

A verify step laid out as token rows (worker/step_inputs.py: each token its own decode row, a
request's tokens consecutive) whose rows are all greedy and plain (Sampler.greedy_only: no
processor, penalty, logprobs or grammar), with at most GREEDY_MAX_DRAFTS drafts a request, needs
nothing from its logits but each token row's argmax: a request's accepted drafts are the
argmaxes before its first mismatch, its token the argmax there. So its whole tail — the rows'
samples, the accept scan, the chain flags and the rows' last tokens — is an argmax over the
token rows' logits and one kernel (kernels.greedy_verify), reading each request's draft count
and chain flag from the step's packed `verify_segments` column, and its result reaches the host
in one contiguous copy: T ids, then T counts (a request's at its first token). (Contiguous on
both sides: a strided device-to-host copy goes through a pageable temporary and blocks the host.)

With CUDA graphs both ops are captured per decode size, after the decode graphs and in their
pool, over the decode graphs' logits buffer and the step buffers in that shape's layout: the
tail is one replay. Eagerly (no graph of the size; CPU) the same two ops run over the step's
logits, in token order (Verifier.prepare points logits_indices at every token).

Before (Runs Y), a greedy verify step gathered its logits rows into [sampled rows, drafts]
order, took their argmax, stored and copied the rows' samples, compared the drafts, ran the
scan kernel and made three host copies of its outcome: about 10 launches after the replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import kernels
from executor_svc.worker.cuda_graphs import capture_graph
from executor_svc.worker.step_buffers import StepBuffers


@dataclass(frozen=True)
class GreedyOutcome:
    """A greedy tail's result on its way to the host (read after the step's event)."""

    ids: torch.Tensor  # [N] int64 pinned host: each token row's argmax
    counts: torch.Tensor  # [N] int64 pinned host: tokens each request emits, at its first token


def write_segments(buf: StepBuffers, offsets: np.ndarray, num_drafts: np.ndarray,
                   chained: np.ndarray | None, num_tokens: int) -> None:
    """The step's verify_segments column (host set selected): (d << 1) | chained at each
    request's first token (every request of the step, decode rows with d = 0), -1 elsewhere;
    and logits_indices = every token, in order (the eager forward's logits rows)."""
    seg = buf.verify_segments.np
    seg[:num_tokens] = -1
    seg[offsets] = num_drafts << 1 if chained is None else (num_drafts << 1) | chained
    buf.logits_indices.np[:num_tokens] = np.arange(num_tokens)


def greedy_result(offsets: np.ndarray, ids: list[int], counts: list[int]) -> list[list[int]]:
    """Each request's tokens (plan order; void chained rows: none): ids[s : s + counts[s]]."""
    return [ids[s:s + counts[s]] for s in offsets.tolist()]


class GreedyVerify:
    """The tail's device state: its output (n ids then n counts for a step of n token rows), two
    pinned host copies of it (by step parity) and, once captured, a graph per decode size."""

    def __init__(self, buffers: StepBuffers, last_tokens: torch.Tensor, chain_ok: torch.Tensor,
                 max_tokens: int):
        self.buffers, self.last_tokens, self.chain_ok = buffers, last_tokens, chain_ok
        device = last_tokens.device
        self.out = torch.zeros(2 * max_tokens, dtype=torch.int64, device=device)  # [:n] ids, [n:2n] counts
        self._host = [torch.zeros(2 * max_tokens, dtype=torch.int64, pin_memory=device.type == "cuda")
                      for _ in range(2)]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @torch.inference_mode()
    def capture(self, logits: torch.Tensor, sizes: list[int], pool) -> None:
        """Captures the tail of each decode size over `logits` (the decode graphs' output), each
        in its shape's layout of the step buffers, every token padded (writes nothing)."""
        buf, largest = self.buffers, max(sizes, default=0)
        buf.pad(0, 0, 0, largest, largest)
        stream = torch.cuda.Stream()
        for size in sorted(sizes, reverse=True):
            buf.copy_to_device(size, size)
            torch.cuda.synchronize()  # the copy ran (the capture reads it on another stream)
            self.graphs[size] = capture_graph(lambda: self._run(logits, size), pool, stream)
        torch.cuda.synchronize()

    def launch(self, logits: torch.Tensor, num_rows: int, graph_size: int, parity: int) -> GreedyOutcome:
        """Enqueues the tail of a step of num_rows token rows (logits [>= num_rows, V], row i =
        token i) and its copy into host set `parity`: its graph when graph_size has one."""
        n = graph_size or num_rows
        graph = self.graphs.get(graph_size)
        if graph is not None:
            graph.replay()
        else:
            self._run(logits, n)
        host = self._host[parity % 2][:2 * n]
        host.copy_(self.out[:2 * n], non_blocking=True)
        return GreedyOutcome(host[:n], host[n:])

    def _run(self, logits: torch.Tensor, n: int) -> None:
        buf, ids, counts = self.buffers, self.out[:n], self.out[n:2 * n]
        torch.argmax(logits[:n], dim=-1, out=ids)
        kernels.greedy_verify(ids, buf.input_ids.gpu[:n], buf.verify_segments.gpu[:n], buf.src_rows.gpu[:n],
                              self.last_tokens, self.chain_ok, counts)
