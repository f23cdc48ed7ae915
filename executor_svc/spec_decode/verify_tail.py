"""A token-rows verify step's tail: two or three kernels, captured per decode size.

A verify step laid out as token rows (worker/step_inputs.py: each token its own decode row, a
request's tokens consecutive) whose rows sample plainly (tail_kind: no processor, penalty,
logprobs, grammar, nor top-k / top-p on a random row), with at most TOKEN_ROWS_MAX_DRAFTS drafts
a request, needs from each token row's logits one token and, where a draft follows, whether
that draft is accepted:

- greedy (every row greedy): the argmax; a draft is accepted where it equals the argmax before
  it, and the token where a request stops is the argmax there. One argmax over the token rows.
- random (some row samples): the sampler's draw (kernels.gumbel_sample, one launch) at every
  token row; a draft is accepted where it equals the draw before it (verify.match_drafts's
  rule), and the token where a request stops is the draw there. Its columns (temperature, seed,
  the position of the token drawn) are the Sampler's step columns, written a token row each
  (Verifier.prepare), so each draw is bit for bit the one a decode step would make.

Then one kernel (kernels.verify_token_rows) finds each request's accepted drafts, writes its
tokens in place (accepted drafts, then the token where it stopped), its count at its first token,
the chain flags and the rows' last tokens, reading each request's draft count and chain flag
from the step's packed `verify_segments` column; the result reaches the host in one contiguous
copy: T tokens, then T counts. (Contiguous on both sides: a strided device-to-host copy goes
through a pageable temporary and blocks the host.)

With CUDA graphs the tail is captured per decode size and kind, after the decode graphs and in
their pool, over the decode graphs' logits buffer and the step buffers in that shape's layout:
one replay. Eagerly (no graph of the size; CPU) the same ops run over the step's logits, in
token order (Verifier.prepare points logits_indices at every token).

Before (Runs Y), a verify step gathered its logits rows into [sampled rows, drafts] order,
sampled, copied the rows' samples, scored the drafts, ran the scan kernel and made three host
copies of its outcome: about 10 launches after the replay, and 11 staged columns for random rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import kernels
from executor_svc.sample.inputs import SampleInputs, SampleStep
from executor_svc.worker.cuda_graphs import capture_graph
from executor_svc.worker.host_device import HOST_SETS
from executor_svc.worker.step_buffers import StepBuffers

GREEDY, RANDOM = "greedy", "random"


def tail_kind(step: SampleStep) -> str | None:
    """The tail a token-rows verify step whose rows sample as `step` says can take: GREEDY,
    RANDOM, or None (a processor, penalty, logprobs, grammar or cut: the scan path)."""
    if not step.plain or step.need_penalties or step.num_logprobs >= 0:
        return None
    return GREEDY if step.all_greedy else RANDOM


@dataclass(frozen=True)
class TailOutcome:
    """A tail's result on its way to the host (read after the step's event)."""

    ids: torch.Tensor  # [N] int64 pinned host: each request's tokens from its first token row on
    counts: torch.Tensor  # [N] int64 pinned host: tokens each request emits, at its first token


def write_segments(buf: StepBuffers, offsets: np.ndarray, num_drafts: np.ndarray,
                   chained: np.ndarray | None, num_tokens: int) -> None:
    """The step's verify_segments column (host set selected): (d << 1) | chained at each
    request's first token (every request of the step, decode rows with d = 0), -1 at its drafts
    (padded rows: -2, buf.pad); and logits_indices = every token, in order (the eager forward's
    logits rows)."""
    seg = buf.verify_segments.np
    seg[:num_tokens] = -1
    seg[offsets] = num_drafts << 1 if chained is None else (num_drafts << 1) | chained
    buf.logits_indices.np[:num_tokens] = np.arange(num_tokens)


def tail_result(offsets: np.ndarray, ids: list[int], counts: list[int]) -> list[list[int]]:
    """Each request's tokens (plan order; void chained rows: none): ids[s : s + counts[s]]."""
    return [ids[s:s + counts[s]] for s in offsets.tolist()]


class VerifyTail:
    """The tail's device state: its output (n tokens then n counts for a step of n token rows),
    two pinned host copies of the output (by step
    parity) and, once captured, a graph per decode size and kind."""

    def __init__(self, buffers: StepBuffers, inputs: SampleInputs, last_tokens: torch.Tensor,
                 chain_ok: torch.Tensor, max_tokens: int):
        self.buffers, self.inputs, self.last_tokens, self.chain_ok = buffers, inputs, last_tokens, chain_ok
        device = last_tokens.device
        self.out = torch.zeros(2 * max_tokens, dtype=torch.int64, device=device)  # [:n] tokens, [n:2n] counts
        self._host = [torch.zeros(2 * max_tokens, dtype=torch.int64, pin_memory=device.type == "cuda")
                      for _ in range(HOST_SETS)]
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}

    @torch.inference_mode()
    def capture(self, logits: torch.Tensor, sizes: list[int], pool) -> None:
        """Captures both tails of each decode size over `logits` (the decode graphs' output),
        each in its shape's layout of the step buffers, every token padded (writes nothing)."""
        buf, largest = self.buffers, max(sizes, default=0)
        buf.pad(0, 0, 0, largest, largest)
        stream = torch.cuda.Stream()
        for size in sorted(sizes, reverse=True):
            buf.copy_to_device(size, size)
            self.inputs.copy_to_device()
            torch.cuda.synchronize()  # the copies ran (the capture reads them on another stream)
            for kind in (GREEDY, RANDOM):
                self.graphs[size, kind] = capture_graph(lambda: self._run(logits, size, kind), pool, stream)
        torch.cuda.synchronize()

    def launch(self, logits: torch.Tensor, num_rows: int, graph_size: int, kind: str, parity: int) -> TailOutcome:
        """Enqueues the tail of a step of num_rows token rows (logits [>= num_rows, V], row i =
        token i) and its copy into host set `parity`: its graph when graph_size has one."""
        n = graph_size or num_rows
        graph = self.graphs.get((graph_size, kind))
        if graph is not None:
            graph.replay()
        else:
            self._run(logits, n, kind)
        host = self._host[parity % HOST_SETS][:2 * n]
        host.copy_(self.out[:2 * n], non_blocking=True)
        return TailOutcome(host[:n], host[n:])

    def _run(self, logits: torch.Tensor, n: int, kind: str) -> None:
        buf, ids, counts = self.buffers, self.out[:n], self.out[n:2 * n]
        inputs, segments = buf.input_ids.gpu[:n], buf.verify_segments.gpu[:n]
        if kind == GREEDY:
            torch.argmax(logits[:n], dim=-1, out=ids)
        else:
            col = self.inputs
            ids.copy_(kernels.gumbel_sample(logits[:n], col.temperature.gpu[:n], col.seeds.gpu[:n], col.positions.gpu[:n]))
        kernels.verify_token_rows(ids, inputs, segments, buf.src_rows.gpu[:n], self.last_tokens, self.chain_ok, counts)
