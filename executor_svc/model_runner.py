"""ModelRunner: runs one step plan on the device — update rows, prepare inputs, forward, sample.

A step is launched (enqueued on the device, no host sync) and finished later (wait for its
event, read the sampled ids), so the next step can be launched while this one runs."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from executor_svc import kv_cache, loader
from executor_svc.attention import AttentionMetadata
from executor_svc.config import ExecutorConfig
from executor_svc.input_batch import InputBatch, RequestState, StepBuffers
from executor_svc.plan import ExecutorInfo, StepOutput, StepPlan
from executor_svc.sampler import SamplingTensors, sample
from executor_svc.step_inputs import Limits, PreparedStep, Scheduled, prepare_step

log = logging.getLogger(__name__)


@dataclass
class StepHandle:
    """A launched step: what finish() needs to turn it into its StepOutput."""

    out: StepOutput  # step_id, prepare_us, graph_size set by launch(); the rest by finish()
    states: list[RequestState] = field(default_factory=list)  # requests that sample, in order
    sampled_host: torch.Tensor | None = None  # [N] int64 view of a pinned host buffer
    timer: _Timer | None = None  # CUDA: its last event marks the step's completion
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def step_id(self) -> int:
        return self.out.step_id


class ModelRunner:
    """Owns the model, the KV cache, the request rows and the static buffers of one device."""

    def __init__(self, config: ExecutorConfig):
        from executor_svc.random_model import demo_model_path

        self.config = config
        self.device = torch.device(config.device)
        self.dtype = getattr(torch, config.dtype)
        self.model_path = Path(config.model) if config.model else demo_model_path()
        t0 = time.perf_counter()
        self.hf_config = loader.load_hf_config(self.model_path)
        self.model = loader.load_model(self.model_path, self.device, self.dtype)
        self.args = self.model.args
        log.info("loaded %s in %.2f s", self.model_path, time.perf_counter() - t0)
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len or self.args.max_position_embeddings
        self.max_blocks_per_seq = -(-self.max_model_len // self.block_size)
        self.batch = InputBatch(config.max_num_seqs, self.max_blocks_per_seq, self.device)
        self.limits = Limits(self.block_size, self.max_model_len, config.max_num_seqs,
                             config.max_num_batched_tokens)
        self.buffers = StepBuffers(config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_blocks_per_seq, self.device)
        # ids sampled by a step, copied here (pinned, one per step parity) and read in finish()
        self._sampled_host = [torch.zeros(config.max_num_seqs, dtype=torch.int64,
                                          pin_memory=self.device.type == "cuda") for _ in range(2)]
        self._parity = 0  # host buffer set of the next launched step
        self._handles: list[StepHandle | None] = [None, None]  # last launched step of each parity
        self.num_blocks = self._measure_num_blocks()
        self.kv_caches = kv_cache.allocate_kv_caches(self.args, self.num_blocks, self.block_size,
                                                     self.dtype, self.device)
        log.info("KV cache: %d blocks of %d tokens", self.num_blocks, self.block_size)
        self.graphs = None
        if config.use_cuda_graphs:
            from executor_svc.cuda_graphs import GraphRunner

            self.graphs = GraphRunner(self, config.cuda_graph_sizes)

    # ---- start-up -------------------------------------------------------------------------

    def _measure_num_blocks(self) -> int:
        cfg = self.config
        if cfg.num_kv_blocks:
            return cfg.num_kv_blocks
        if self.device.type != "cuda":
            budget = int(cfg.cpu_kv_cache_gib * (1 << 30))
        else:
            budget = kv_cache.cuda_kv_budget(self.device, cfg.gpu_memory_utilization, self._profile_run())
        num_blocks = kv_cache.num_blocks_from_budget(budget, self.args, self.block_size, self.dtype)
        if num_blocks < 2:
            raise RuntimeError(f"no memory left for the KV cache (budget {budget} bytes)")
        return num_blocks

    @torch.inference_mode()
    def _profile_run(self) -> int:
        """Runs the largest step (max_num_batched_tokens, as sequences of <= 512 tokens) over a
        scratch cache; returns the activation peak in bytes above the resident memory."""
        t = self.config.max_num_batched_tokens
        seq = min(512, self.max_model_len)
        lens = [seq] * (t // seq) + ([t % seq] if t % seq else [])
        blocks_per_seq = -(-seq // self.block_size)
        caches = kv_cache.allocate_kv_caches(self.args, 1 + blocks_per_seq, self.block_size,
                                             self.dtype, self.device)
        buf = self.buffers
        pos = np.concatenate([np.arange(n) for n in lens])
        buf.input_ids.np[:t], buf.use_last.np[:t], buf.positions.np[:t] = 0, False, pos
        buf.slot_mapping.np[:t] = self.block_size + pos  # blocks 1.. of the scratch cache
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        table = torch.arange(1, 1 + blocks_per_seq, dtype=torch.int32, device=self.device)
        attn = AttentionMetadata(
            slot_mapping=buf.slot_mapping.copy_to_device(t),
            block_tables=table.expand(len(lens), -1).contiguous(),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            query_start_loc=torch.tensor(np.cumsum([0] + lens), dtype=torch.int32, device=self.device),
            max_query_len=seq, max_seq_len=seq, is_decode=False)
        hidden = self.model(buf.input_ids.copy_to_device(t), buf.positions.copy_to_device(t), attn, caches)
        self.model.compute_logits(hidden[: self.config.max_num_seqs])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del caches, hidden
        return peak

    def info(self) -> ExecutorInfo:
        cfg = self.config
        return ExecutorInfo(
            model_name=cfg.model_name or self.model_path.name, model_path=str(self.model_path),
            vocab_size=self.args.vocab_size,
            eos_token_ids=tuple(loader.eos_token_ids(self.model_path, self.hf_config)),
            max_model_len=self.max_model_len, block_size=self.block_size, num_blocks=self.num_blocks,
            cuda_graph_sizes=tuple(self.graphs.sizes) if self.graphs else (),
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            device=self.device.type, dtype=cfg.dtype)

    def reset(self) -> None:
        """Finishes any launched step, then forgets every request."""
        for handle in self._handles:
            if handle is not None:
                self.finish(handle)
        self._handles = [None, None]
        self.batch.clear()

    # ---- one step -------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepOutput:
        """Runs one step plan; returns the sampled token of each request that completed its known tokens."""
        return self.finish(self.launch(plan))

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> StepHandle:
        """Enqueues one step on the device and returns without waiting for it.

        Updates rows, prepares the inputs in host set (step parity), copies them non-blocking,
        runs the forward (graph replay or eager), samples on the device, stores the ids as the
        rows' last tokens, enqueues their copy into a pinned host buffer and records an event.
        No host synchronisation, except when the step that last used this parity's buffers has
        not been finished yet (more than two steps outstanding): then it is finished first.
        Steps must be finished in launch order; finish() may run on another thread.
        """
        t0 = time.perf_counter()
        scheduled = self._update_states(plan)
        out = StepOutput(step_id=plan.step_id)
        if not scheduled:
            return StepHandle(out, finished=True)
        parity = self._parity
        self._parity ^= 1
        prev = self._handles[parity]
        if prev is not None:
            self.finish(prev)  # normally done already: its buffers are free
        try:
            self.buffers.use_host(parity)
            step = self._prepare(scheduled)
            graph_size = self.graphs.size_for(step) if self.graphs else 0
            attn = self._copy_inputs(step, graph_size)
            timer = _Timer(self.device)
            out.prepare_us = int((time.perf_counter() - t0) * 1e6)
            out.graph_size = graph_size
            timer.mark()
            logits = self._forward(step, attn, graph_size)  # [N, V] float32 or the model dtype
            timer.mark()
            sampled_host = self._sampled_host[parity][:step.num_sample]
            if step.num_sample:
                self._sample(step, logits, sampled_host)
            timer.mark()  # after the copy of the ids: the step's completion event
        except BaseException:
            if self.device.type == "cuda":  # copies out of this host set may still be pending
                torch.cuda.current_stream(self.device).synchronize()
            raise
        by_row = self.batch.states
        states = [by_row[r] for r in step.sample_rows.tolist()]
        handle = StepHandle(out, states, sampled_host, timer)
        self._handles[parity] = handle
        return handle

    def finish(self, handle: StepHandle) -> StepOutput:
        """Waits for a launched step, reads its sampled ids, appends them to the requests, fills
        the timings. Idempotent; thread-safe against launch() of the next step."""
        with handle.lock:
            if handle.finished:
                return handle.out
            out, timer = handle.out, handle.timer
            timer.wait()  # CUDA: event.synchronize() (releases the GIL)
            out.forward_us, out.sample_us = timer.elapsed_us()
            if handle.states:
                out.token_ids = handle.sampled_host.tolist()
                out.req_ids = [s.req_id for s in handle.states]
                for state, token in zip(handle.states, out.token_ids):
                    state.output_token_ids.append(token)
            handle.finished = True
            return out

    def _update_states(self, plan: StepPlan) -> Scheduled:
        """Drops finished/preempted rows, adds new requests, applies block deltas.
        Returns the scheduled rows (num_scheduled_tokens > 0) in plan order."""
        batch = self.batch
        for req_id in (*plan.finished_req_ids, *plan.preempted_req_ids):
            batch.remove(req_id)
        rows, counts = [], []
        for new in plan.new_requests:
            rows.append(batch.add(new).row)
            counts.append(new.num_scheduled_tokens)
        requests = batch.requests
        for cached in plan.cached_requests:
            state = requests.get(cached.req_id)
            if state is None:
                raise KeyError(f"cached request {cached.req_id} is not running on the executor")
            if cached.new_block_ids:
                batch.append_blocks(state, cached.new_block_ids)
            rows.append(state.row)
            counts.append(cached.num_scheduled_tokens)
        try:
            rows += [requests[req_id].row for req_id in plan.decode_req_ids]
        except KeyError as e:
            raise KeyError(f"decode request {e.args[0]} is not running on the executor") from None
        counts += [1] * len(plan.decode_req_ids)
        rows, counts = np.array(rows, dtype=np.int64), np.array(counts, dtype=np.int64)
        keep = counts > 0
        if not keep.all():
            rows, counts = rows[keep], counts[keep]
        return Scheduled(rows, counts)

    def _prepare(self, scheduled: Scheduled) -> PreparedStep:
        """Writes the step's inputs into the host buffers, advances the rows (step_inputs.py)."""
        return prepare_step(self.batch, self.buffers, scheduled, self.limits)

    def _copy_inputs(self, step: PreparedStep, graph_size: int) -> AttentionMetadata:
        """Copies the first rows of every buffer to the device (padding to graph_size if set)."""
        buf = self.buffers
        t = b = step.num_tokens if not graph_size else graph_size
        if graph_size:
            buf.pad(step.num_reqs, step.num_tokens, graph_size)
        else:
            b = step.num_reqs
        for twin in (buf.input_ids, buf.use_last, buf.src_rows, buf.positions):
            twin.copy_to_device(t)
        buf.small.copy_to_device()  # seq lens, query offsets and the sampling rows: one copy
        n = step.num_sample
        return AttentionMetadata(
            slot_mapping=buf.slot_mapping.copy_to_device(t), block_tables=buf.block_tables.copy_to_device(b),
            seq_lens=buf.seq_lens.gpu[:b], query_start_loc=buf.query_start_loc.gpu[:b + 1],
            max_query_len=step.max_query_len, max_seq_len=step.max_seq_len, is_decode=step.is_decode,
            logits_indices=buf.logits_indices.gpu[:n])

    def input_tokens(self, num_tokens: int) -> torch.Tensor:
        """[T] int64 device: known tokens, or the request's last sampled token where use_last."""
        buf = self.buffers
        last = self.batch.last_sampled_gpu[buf.src_rows.gpu[:num_tokens]]
        return torch.where(buf.use_last.gpu[:num_tokens], last, buf.input_ids.gpu[:num_tokens])

    def _forward(self, step: PreparedStep, attn: AttentionMetadata, graph_size: int) -> torch.Tensor:
        if graph_size:
            logits = self.graphs.replay(graph_size)  # [graph_size, V] model dtype
            return logits[attn.logits_indices]  # model dtype: the sampler reads it once
        t = step.num_tokens
        hidden = self.model(self.input_tokens(t), self.buffers.positions.gpu[:t], attn, self.kv_caches)
        return self.model.compute_logits(hidden[attn.logits_indices])

    def _sample(self, step: PreparedStep, logits: torch.Tensor, sampled_host: torch.Tensor) -> None:
        """Samples [N] ids, stores them as the rows' last tokens on the device and enqueues
        their copy into the (pinned) host buffer; finish() reads them after the event."""
        buf, n = self.buffers, step.num_sample
        params = SamplingTensors(
            temperature=buf.temperature.gpu[:n], top_k=buf.top_k.gpu[:n], top_p=buf.top_p.gpu[:n],
            seeds=buf.seeds.gpu[:n], positions=buf.sample_positions.gpu[:n],
            all_greedy=step.all_greedy, need_top_k_top_p=step.need_top_k_top_p)
        sampled = sample(logits, params)  # [N] int64
        self.batch.last_sampled_gpu.index_copy_(0, buf.sample_rows.gpu[:n], sampled)
        sampled_host.copy_(sampled, non_blocking=True)


class _Timer:
    """Wall-clock marks on CPU; CUDA events on GPU (the last one is the step's completion event)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def wait(self) -> None:
        if self.cuda:
            self.marks[-1].synchronize()

    def elapsed_us(self) -> tuple[int, int]:
        """(forward, sample) in µs; on CUDA only after wait()."""
        a, b, c = self.marks
        if self.cuda:
            return int(a.elapsed_time(b) * 1e3), int(b.elapsed_time(c) * 1e3)
        return int((b - a) * 1e6), int((c - b) * 1e6)
