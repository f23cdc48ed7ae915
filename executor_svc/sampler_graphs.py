"""CUDA graphs for the logits processors and logprobs of decode steps, one pair per decode size.

A decode graph (cuda_graphs.py) leaves [size, V] logits in its shared output buffer, row i =
step row i. For the same size this module captures
  - a processors graph: logit bias, min_tokens mask, penalties, min_p over all `size` rows
    (parameters from the static step buffers, tables gathered by sample_rows; padded rows
    read the scratch row) into a float32 [size, V] output the sampler then reads;
  - a logprobs graph: raw log_softmax of the logits, the logprob and rank of the sampled ids
    (copied into a static buffer first) and the top max_logprobs alternatives.
Each is replayed only by steps where some row asked for it, so a batch that uses neither
replays exactly what it did before (the decode graph, then the sampler). Captured into the
decode graphs' memory pool, after them.
"""

from __future__ import annotations

import logging
import time

import torch

from executor_svc.logits_processors import (LogprobsOut, ProcessorParams, ProcessorTables,
                                            apply_processors, compute_logprobs)
from executor_svc.step_buffers import StepBuffers

log = logging.getLogger(__name__)


def processor_params(buf: StepBuffers, n: int) -> ProcessorParams:
    """Views of the first n rows of the processors' static parameters."""
    return ProcessorParams(
        rows=buf.sample_rows.gpu[:n], positions=buf.sample_positions.gpu[:n],
        temperature=buf.temperature.gpu[:n], min_p=buf.min_p.gpu[:n], presence=buf.presence.gpu[:n],
        frequency=buf.frequency.gpu[:n], repetition=buf.repetition.gpu[:n], min_pos=buf.min_pos.gpu[:n])


class SamplerGraphs:
    """Captures (at construction) and replays the processors and logprobs graph of each size.

    logits: the decode graphs' [largest, V] output buffer; sizes: their captured sizes;
    max_logprobs: the top-k every logprobs graph extracts (a step slices what it asked)."""

    def __init__(self, logits: torch.Tensor, buffers: StepBuffers, tables: ProcessorTables,
                 sizes: list[int], max_logprobs: int, pool):
        self.logits, self.buffers, self.tables = logits, buffers, tables
        self.sizes, self.max_logprobs = sizes, max_logprobs
        largest, vocab, dev = logits.shape[0], logits.shape[1], logits.device
        self.processed = torch.empty(largest, vocab, dtype=torch.float32, device=dev)
        self.sampled = torch.zeros(largest, dtype=torch.int64, device=dev)
        self.lp = LogprobsOut(
            logprobs=torch.zeros(largest, dtype=torch.float32, device=dev),
            ranks=torch.zeros(largest, dtype=torch.int64, device=dev),
            top_ids=torch.zeros(largest, max_logprobs, dtype=torch.int64, device=dev),
            top_logprobs=torch.zeros(largest, max_logprobs, dtype=torch.float32, device=dev))
        self._runs = {"processors": self._run_processors, "logprobs": self._run_logprobs}
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}  # (kind, size) -> graph
        self._capture(pool)

    def processors(self, size: int, n: int) -> torch.Tensor:
        """Replays the processors graph of `size` -> processed float32 logits of rows [:n]."""
        self._replay("processors", size)
        return self.processed[:n]

    def logprobs(self, size: int, sampled: torch.Tensor) -> LogprobsOut:
        """Replays the logprobs graph of `size` for the n sampled ids -> views of rows [:n]."""
        n = sampled.shape[0]
        self.sampled[:n].copy_(sampled)
        self._replay("logprobs", size)
        lp = self.lp
        return LogprobsOut(lp.logprobs[:n], lp.ranks[:n], lp.top_ids[:n], lp.top_logprobs[:n])

    def _run_processors(self, size: int) -> None:
        apply_processors(self.logits[:size], processor_params(self.buffers, size), self.tables,
                         out=self.processed[:size])

    def _run_logprobs(self, size: int) -> None:
        lp = self.lp
        compute_logprobs(self.logits[:size], self.sampled[:size], self.max_logprobs,
                         out=LogprobsOut(lp.logprobs[:size], lp.ranks[:size], lp.top_ids[:size],
                                         lp.top_logprobs[:size]))

    def _replay(self, kind: str, size: int) -> None:
        self.graphs[(kind, size)].replay()

    @torch.inference_mode()
    def _capture(self, pool) -> None:
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        for size in sorted(self.sizes, reverse=True):
            for kind, run in self._runs.items():
                with torch.cuda.stream(stream):
                    run(size)  # warm-up off the capture
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    run(size)
                self.graphs[(kind, size)] = graph
        torch.cuda.synchronize()
        log.info("captured %d processor and logprobs graphs in %.1f s", 2 * len(self.sizes),
                 time.perf_counter() - t0)
