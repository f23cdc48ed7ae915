"""CUDA graphs for decode steps: captured at start-up, replayed when a pure-decode batch fits.

One graph per batch size, captured largest first into one shared memory pool. A graph reads
the static step buffers (input ids, use-last mask, positions, slots, seq lens, block tables)
and writes the logits of all its rows into one output buffer shared by every graph (kept out
of the graph pool: per-graph outputs of [size, vocab] would hold gigabytes); a step of n < size rows pads the rest (seq_len 0, slot -1,
cleared block-table rows), and only the sampled rows' logits are read back. Sampling runs
after the replay, eagerly (it branches on host flags).
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

import torch

from executor_svc.attention import AttentionMetadata

if TYPE_CHECKING:
    from executor_svc.model_runner import ModelRunner
    from executor_svc.step_inputs import PreparedStep

log = logging.getLogger(__name__)


class GraphRunner:
    """Captures and replays the decode graphs of one ModelRunner."""

    def __init__(self, runner: "ModelRunner", sizes: tuple[int, ...]):
        self.runner = runner
        limit = min(runner.config.max_num_seqs, runner.config.max_num_batched_tokens)
        self.sizes = sorted({s for s in sizes if 0 < s <= limit})  # ascending
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits = self._output_buffer()
        self.pool = torch.cuda.graph_pool_handle()
        self._capture_all()

    def size_for(self, step: "PreparedStep") -> int:
        """Smallest captured size >= the step's batch for a pure-decode step; 0 = run eagerly."""
        if not step.is_decode or not self.sizes or step.num_reqs > self.sizes[-1]:
            return 0
        return self.sizes[bisect.bisect_left(self.sizes, step.num_reqs)]

    def replay(self, size: int) -> torch.Tensor:
        """Replays the graph of `size` over the (already copied) static buffers -> [size, V]."""
        self.graphs[size].replay()
        return self.logits[:size]

    def destroy(self) -> None:
        self.graphs.clear()

    def _output_buffer(self) -> torch.Tensor:
        """[largest size, V] in the model dtype: the logits output of every graph."""
        weight = self.runner.model.lm_head.weight
        return torch.empty(self.sizes[-1], weight.shape[0], dtype=weight.dtype, device=weight.device)

    def _metadata(self, size: int) -> AttentionMetadata:
        buf = self.runner.buffers  # views of the static device buffers: stable addresses
        return AttentionMetadata(
            slot_mapping=buf.slot_mapping.gpu[:size], block_tables=buf.block_tables.gpu[:size],
            seq_lens=buf.seq_lens.gpu[:size], query_start_loc=buf.query_start_loc.gpu[:size + 1],
            max_query_len=1, max_seq_len=self.runner.max_model_len, is_decode=True)

    def _run(self, size: int, attn: AttentionMetadata) -> torch.Tensor:
        r = self.runner
        hidden = r.model(r.input_tokens(size), r.buffers.positions.gpu[:size], attn, r.kv_caches)
        return r.model.compute_logits(hidden, out=self.logits[:size])  # [size, V]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        buf = self.runner.buffers
        largest = self.sizes[-1]
        buf.query_start_loc.np[0] = 0
        buf.pad(0, 0, largest)  # every row a padded row: reads nothing, writes nowhere
        for twin in (buf.input_ids, buf.use_last, buf.src_rows, buf.positions, buf.slot_mapping):
            twin.copy_to_device(largest)
        for twin in (buf.seq_lens, buf.block_tables):
            twin.copy_to_device(largest)
        buf.query_start_loc.copy_to_device(largest + 1)
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        for size in _progress(sorted(self.sizes, reverse=True)):
            attn = self._metadata(size)
            with torch.cuda.stream(stream):
                self._run(size, attn)  # warm-up: lazy init and kernel compilation, off the capture
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                self._run(size, attn)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        self.pool_bytes = free_before - torch.cuda.mem_get_info()[0]
        log.info("captured %d CUDA graphs (sizes %s) in %.1f s, graph pool %.0f MiB",
                 len(self.sizes), self.sizes, self.capture_s, self.pool_bytes / (1 << 20))


def _progress(sizes: list[int]):
    try:
        from tqdm import tqdm

        return tqdm(sizes, desc="capturing CUDA graphs", unit="graph")
    except ImportError:
        return _log_each(sizes)


def _log_each(sizes: list[int]):
    for size in sizes:
        log.info("capturing CUDA graph for batch size %d", size)
        yield size
