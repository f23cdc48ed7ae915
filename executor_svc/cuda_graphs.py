"""CUDA graphs for decode steps: captured at start-up, replayed when a pure-decode batch fits.

One graph per batch size, captured largest first into one shared memory pool. A graph reads
the static step buffers (input ids, use-last mask, positions, slots, seq lens, block tables)
and writes the logits of all its rows into one output buffer shared by every graph (kept out
of the graph pool: per-graph outputs of [size, vocab] would hold gigabytes); a step of n < size
rows pads the rest (seq_len 0, slot -1, cleared block-table rows), and only the sampled rows'
logits are read back. Sampling runs after the replay, eagerly (it branches on host flags).

The GraphRunner is given what the graphs read and write (model, step buffers, KV caches, the
rows' last sampled tokens) and knows nothing of the ModelRunner that replays them.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from executor_svc.attention import AttentionMetadata

if TYPE_CHECKING:
    from executor_svc.models.llama import KVCache, LlamaForCausalLM
    from executor_svc.step_buffers import StepBuffers
    from executor_svc.step_inputs import PreparedStep

log = logging.getLogger(__name__)


class GraphRunner:
    """Captures (at construction) and replays one decode graph per batch size.

    model, buffers and kv_caches are the ones eager steps use; last_sampled is
    InputBatch.last_sampled_gpu ([max_num_seqs + 1] int64 device), read by the graphs as the
    decode input; max_model_len is the host bound of seq_lens that every replay runs with.
    """

    def __init__(self, model: LlamaForCausalLM, buffers: StepBuffers, kv_caches: list[KVCache],
                 last_sampled: torch.Tensor, sizes: Iterable[int], max_model_len: int):
        self.model, self.buffers, self.kv_caches = model, buffers, kv_caches
        self.last_sampled = last_sampled
        self.max_model_len = max_model_len
        limit = min(buffers.max_num_seqs, buffers.max_num_tokens)
        self.sizes = sorted({s for s in sizes if 0 < s <= limit})  # ascending
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # batch size -> its graph
        self.logits = self._output_buffer()  # [largest size, V] model dtype
        self.capture_s, self.pool_bytes = 0.0, 0  # measured by capture()
        self.capture()

    def size_for(self, step: PreparedStep) -> int:
        """Smallest captured size >= the step's batch for a pure-decode step; 0 = run eagerly."""
        if not step.is_decode or not self.sizes or step.num_reqs > self.sizes[-1]:
            return 0
        return self.sizes[bisect.bisect_left(self.sizes, step.num_reqs)]

    def replay(self, size: int) -> torch.Tensor:
        """Replays the graph of `size` over the (already copied) static buffers -> [size, V]."""
        self.graphs[size].replay()
        return self.logits[:size]

    def _output_buffer(self) -> torch.Tensor:
        """[largest size, V] in the model dtype: the logits output of every graph."""
        weight = self.model.lm_head.weight
        return torch.empty(self.sizes[-1], weight.shape[0], dtype=weight.dtype, device=weight.device)

    def _metadata(self, size: int) -> AttentionMetadata:
        # one token per row; seq_lens are read on the device, so one graph serves every length
        return AttentionMetadata.from_buffers(self.buffers, size, size, max_query_len=1,
                                              max_seq_len=self.max_model_len)

    def _run(self, size: int, attn: AttentionMetadata) -> torch.Tensor:
        """The decode forward that a graph records: [size] rows -> [size, V] logits."""
        positions = self.buffers.positions.gpu[:size]
        hidden = self.model(self.buffers.input_tokens(self.last_sampled, size), positions, attn,
                            self.kv_caches)
        return self.model.compute_logits(hidden, out=self.logits[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every size, largest first, into one memory pool; logs time and pool size."""
        buf = self.buffers
        largest = self.sizes[-1]
        buf.query_start_loc.np[0] = 0
        buf.pad(0, 0, largest)  # every row a padded row: reads nothing, writes nowhere
        buf.copy_to_device(largest, largest)
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()  # shared by every size
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
