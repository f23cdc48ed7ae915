"""CUDA graphs for whole steps: captured at start-up, replayed when a step fits one.

Two families share one memory pool and one logits output buffer:
  - decode graphs, one per batch size B: B rows of one token each, the split-K decode
    attention kernel, logits of every row;
  - mixed graphs, one per token count T (prefill chunks, and decode rows beside them): up to
    R = min(T, max_num_seqs) requests, the varlen attention kernel, whose grid depends on the
    shapes alone (kernels/attention_prefill.py), so one graph serves every mix of query
    lengths that adds up to at most T tokens; logits of the R rows named by logits_indices,
    and every token's hidden state copied into one shared buffer, so steps that need more
    than the sampled rows' logits (speculative verify rows, prompt logprobs) replay them too
    and compute those logits from the hidden states after the replay.
A graph reads the static step buffers (input ids, use-last mask, positions, slots, seq lens,
query start offsets, block tables, logits indices; packed for its shape: step_buffers.py) and writes into the shared output buffer
(kept out of the graph pool: per-graph outputs of [size, vocab] would hold gigabytes). A step
smaller than its graph pads the rest (padded tokens: slot -1, no request; padded requests:
seq_len 0, no tokens; padded logits rows: token 0), and only the sampled rows' logits are read.
Sampling runs after the replay (decode steps replay their processor/logprobs graphs too).

The GraphRunner is given what the graphs read and write (model, step buffers, KV caches, the
rows' last sampled tokens) and knows nothing of the ModelRunner that replays them.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import torch

from executor_svc.models.attention import AttentionMetadata

if TYPE_CHECKING:
    from executor_svc.models.kv_cache import KVCache
    from executor_svc.models.llama import LlamaForCausalLM
    from executor_svc.worker.step_buffers import StepBuffers
    from executor_svc.worker.step_inputs import PreparedStep

log = logging.getLogger(__name__)


class GraphShape(NamedTuple):
    """The padded shape of one captured graph."""

    num_tokens: int  # T: tokens (decode: = num_reqs)
    num_reqs: int  # B: requests, and rows of logits
    decode: bool  # one token per request: the decode kernel, every row's logits


class GraphRunner:
    """Captures (at construction) and replays the decode graph of each batch size in `sizes`
    and the mixed graph of each token count in `mixed_sizes`.

    model, buffers and kv_caches are the ones eager steps use; last_sampled is
    the Sampler's last_tokens ([max_num_seqs + 1] int64 device), read by the graphs as the
    decode input; max_model_len is the host bound of seq_lens that every replay runs with.
    """

    def __init__(self, model: LlamaForCausalLM, buffers: StepBuffers, kv_caches: list[KVCache],
                 last_sampled: torch.Tensor, sizes: Iterable[int], max_model_len: int,
                 mixed_sizes: Iterable[int] = ()):
        self.model, self.buffers, self.kv_caches = model, buffers, kv_caches
        self.last_sampled = last_sampled
        self.max_model_len = max_model_len
        limit = min(buffers.max_num_seqs, buffers.max_num_tokens)
        self.sizes = sorted({s for s in sizes if 0 < s <= limit})  # ascending
        self.mixed_sizes = sorted({t for t in mixed_sizes if 1 < t <= buffers.max_num_tokens})
        self.decode_shapes = [GraphShape(s, s, True) for s in self.sizes]
        self.mixed_shapes = [GraphShape(t, min(t, buffers.max_num_seqs), False) for t in self.mixed_sizes]
        self.shapes = self.decode_shapes + self.mixed_shapes
        self.graphs: dict[GraphShape, torch.cuda.CUDAGraph] = {}
        self.logits = self._output_buffer()  # [most rows of any graph, V] model dtype
        # [most tokens of a mixed graph, H]: every token's final hidden state, mixed graphs
        self.hidden = torch.empty(max(self.mixed_sizes, default=0), model.args.hidden_size,
                                  dtype=self.logits.dtype, device=self.logits.device)
        self.capture_s, self.pool_bytes = 0.0, 0  # measured by capture()
        self.capture()

    def shape_for(self, step: PreparedStep, need_hidden: bool = False) -> GraphShape | None:
        """The smallest captured graph the step fits; None = run it eagerly. A pure-decode
        step takes a decode graph, unless it needs the hidden states (need_hidden: verify rows,
        prompt logprobs); any other step a mixed graph of at least its token count."""
        if step.is_decode and not need_hidden and (shape := self.decode_shape(step.num_reqs)) is not None:
            return shape
        if not self.mixed_sizes or step.num_tokens > self.mixed_sizes[-1]:
            return None
        return self.mixed_shapes[bisect.bisect_left(self.mixed_sizes, step.num_tokens)]

    def decode_shape(self, num_reqs: int) -> GraphShape | None:
        """The smallest decode graph of at least num_reqs rows; None = larger than every one."""
        if not self.sizes or num_reqs > self.sizes[-1]:
            return None
        return self.decode_shapes[bisect.bisect_left(self.sizes, num_reqs)]

    def replay(self, shape: GraphShape) -> torch.Tensor:
        """Replays the graph of `shape` over the (already copied and padded) static buffers ->
        its [num_reqs, V] logits: decode, row i = request i; mixed, row i = token
        logits_indices[i]."""
        self.graphs[shape].replay()
        return self.logits[:shape.num_reqs]

    def _output_buffer(self) -> torch.Tensor:
        weight = self.model.lm_head.weight
        rows = max(shape.num_reqs for shape in self.shapes)
        # the whole vocabulary: with tensor parallelism the weight holds this rank's rows only
        return torch.empty(rows, self.model.args.vocab_size, dtype=weight.dtype, device=weight.device)

    def _metadata(self, shape: GraphShape) -> AttentionMetadata:
        # seq_lens and query lengths are read on the device, so one graph serves every length
        return AttentionMetadata.from_buffers(
            self.buffers, shape.num_reqs, shape.num_tokens, max_query_len=1 if shape.decode else shape.num_tokens,
            max_seq_len=self.max_model_len, num_sample=None if shape.decode else shape.num_reqs,
            is_decode=shape.decode)

    def _run(self, shape: GraphShape, attn: AttentionMetadata) -> torch.Tensor:
        """The forward that a graph records -> [num_reqs, V] logits in the output buffer."""
        t = shape.num_tokens
        hidden = self.model(self.buffers.input_tokens(self.last_sampled, t), self.buffers.positions.gpu[:t],
                            attn, self.kv_caches)
        if not shape.decode:
            self.hidden[:t].copy_(hidden)  # read after the replay by steps that need it
            hidden = hidden[attn.logits_indices]  # [R, H]: the rows that may sample
        return self.model.compute_logits(hidden, out=self.logits[:shape.num_reqs])

    @torch.inference_mode()
    def capture(self) -> None:
        """Captures every shape, largest first, into one memory pool; logs time and pool size."""
        buf = self.buffers
        most_reqs = max(shape.num_reqs for shape in self.shapes)
        most_tokens = max(shape.num_tokens for shape in self.shapes)
        buf.query_start_loc.np[0] = 0
        buf.pad(0, 0, 0, most_reqs, most_tokens)  # every row padded: reads nothing, writes nowhere
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()  # shared by every shape
        stream = torch.cuda.Stream()
        for shape in _progress(sorted(self.shapes, key=lambda s: (s.num_tokens, s.decode), reverse=True)):
            buf.copy_to_device(shape.num_reqs, shape.num_tokens)  # the graph reads its shape's layout
            torch.cuda.synchronize()  # the copy ran (the capture reads it on another stream)
            attn = self._metadata(shape)
            self.graphs[shape] = capture_graph(lambda: self._run(shape, attn), self.pool, stream)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        self.pool_bytes = free_before - torch.cuda.mem_get_info()[0]
        log.info("captured %d CUDA graphs (decode batch sizes %s, mixed token counts %s) in %.1f s, "
                 "graph pool %.0f MiB", len(self.shapes), self.sizes, self.mixed_sizes, self.capture_s,
                 self.pool_bytes / (1 << 20))


def capture_graph(run: Callable[[], object], pool, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """One warm-up run on `stream` (lazy init and kernel compilation, off the capture), then
    one more run captured into a graph in `pool`: every graph of the executor is made here."""
    with torch.cuda.stream(stream):
        run()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        run()
    return graph


def _progress(shapes: list[GraphShape]):
    try:
        from tqdm import tqdm

        return tqdm(shapes, desc="capturing CUDA graphs", unit="graph")
    except ImportError:
        return _log_each(shapes)


def _log_each(shapes: list[GraphShape]):
    for shape in shapes:
        log.info("capturing CUDA graph %s", shape)
        yield shape
