"""CUDA graphs for the sampler, logits processors and logprobs of decode steps, per decode size.

A decode graph (worker/cuda_graphs.py) leaves [size, V] logits in its shared output buffer, row i =
step row i. For the same size this module captures
  - a sample graph: the sampler (greedy and temperature rows: one Gumbel-max pass, no top-k /
    top-p) over all `size` rows into a static [size] int64 buffer, and those ids stored as the
    rows' last sampled tokens (padded rows store into the scratch row). Replayed by decode
    steps whose every row samples and none uses a processor or top-k / top-p: the common
    step, whose host launch then costs one replay instead of the sampler's kernel launches;
  - a processors graph: logit bias, min_tokens mask, penalties, min_p over all `size` rows
    (parameters from the sampler's static inputs, tables gathered by their rows; padded rows
    read the scratch row) into a float32 [size, V] output the sampler then reads;
  - a logprobs graph: raw log_softmax of the logits, the logprob and rank of the sampled ids
    (copied into a static buffer first) and the top max_logprobs alternatives.
The processors and logprobs graphs are replayed only by steps where some row asked for them.
Captured into the decode graphs' memory pool, after them.
"""

from __future__ import annotations

import logging
import time

import torch

from executor_svc.sample.inputs import SampleInputs
from executor_svc.sample.logits_processors import LogprobsOut, ProcessorTables, apply_processors, compute_logprobs
from executor_svc.sample.ops import sample
from executor_svc.worker.cuda_graphs import capture_graph

log = logging.getLogger(__name__)


class SamplerGraphs:
    """Captures (at construction) and replays the processors and logprobs graph of each size.

    logits: the decode graphs' [largest, V] output buffer; last_sampled: the rows' last sampled
    tokens (the Sampler's); inputs: the sampler's static inputs; sizes: the decode graphs'
    sizes; max_logprobs: the top-k every logprobs graph extracts (a step slices what it asked)."""

    def __init__(self, logits: torch.Tensor, last_sampled: torch.Tensor, inputs: SampleInputs,
                 tables: ProcessorTables, sizes: list[int], max_logprobs: int, pool):
        self.logits, self.last_sampled, self.inputs, self.tables = logits, last_sampled, inputs, tables
        self.sizes, self.max_logprobs = sizes, max_logprobs
        largest, vocab, dev = logits.shape[0], logits.shape[1], logits.device
        self.processed = torch.empty(largest, vocab, dtype=torch.float32, device=dev)
        self.sampled = torch.zeros(largest, dtype=torch.int64, device=dev)
        self.lp = LogprobsOut(
            logprobs=torch.zeros(largest, dtype=torch.float32, device=dev),
            ranks=torch.zeros(largest, dtype=torch.int64, device=dev),
            top_ids=torch.zeros(largest, max_logprobs, dtype=torch.int64, device=dev),
            top_logprobs=torch.zeros(largest, max_logprobs, dtype=torch.float32, device=dev))
        self._runs = {"sample": self._run_sample, "processors": self._run_processors,
                      "logprobs": self._run_logprobs}
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}  # (kind, size) -> graph
        self._capture(pool)

    def sample(self, size: int, n: int) -> torch.Tensor:
        """Replays the sample graph of `size` -> the [n] sampled ids (a view of the static
        buffer, which the logprobs graph reads), already stored as the rows' last tokens."""
        self._replay("sample", size)
        return self.sampled[:n]

    def processors(self, size: int, n: int) -> torch.Tensor:
        """Replays the processors graph of `size` -> processed float32 logits of rows [:n]."""
        self._replay("processors", size)
        return self.processed[:n]

    def logprobs(self, size: int, sampled: torch.Tensor) -> LogprobsOut:
        """Replays the logprobs graph of `size` for the n sampled ids -> views of rows [:n]."""
        n = sampled.shape[0]
        if sampled.data_ptr() != self.sampled.data_ptr():  # not already there (sample graph)
            self.sampled[:n].copy_(sampled)
        self._replay("logprobs", size)
        lp = self.lp
        return LogprobsOut(lp.logprobs[:n], lp.ranks[:n], lp.top_ids[:n], lp.top_logprobs[:n])

    def _run_sample(self, size: int) -> None:
        self.sampled[:size].copy_(sample(self.logits[:size], self.inputs.tensors(size)))
        self.last_sampled.index_copy_(0, self.inputs.rows.gpu[:size], self.sampled[:size])

    def _run_processors(self, size: int) -> None:
        apply_processors(self.logits[:size], self.inputs.processor_params(size), self.tables,
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
        self.inputs.pad(0, self.inputs.max_num_seqs)  # every row samples into the scratch row
        self.inputs.copy_to_device()
        stream = torch.cuda.Stream()
        for size in sorted(self.sizes, reverse=True):
            for kind, run in self._runs.items():
                self.graphs[(kind, size)] = capture_graph(lambda: run(size), pool, stream)
        torch.cuda.synchronize()
        log.info("captured %d sample, processor and logprobs graphs in %.1f s", len(self.graphs),
                 time.perf_counter() - t0)
