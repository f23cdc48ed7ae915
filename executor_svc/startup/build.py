"""Executor start-up: everything before the first step, in order, done once.

Resolve the model folder, refuse what is not implemented (model_checks: one-line ModelError),
load the weights, create the request rows and step buffers, measure the activation peak of
the largest step (CUDA), size and allocate the KV cache from what is left, capture the decode
graphs, hand all of it to a ModelRunner (which only runs steps) and warm it up (warmup.py: every
kernel variant a request can reach is compiled before the first request).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader import checks as model_checks, safetensors as loader, source as model_source
from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.llama import LlamaForCausalLM
from executor_svc.models.persistent import PersistentDecode
from executor_svc.parallel.state import SINGLE, TensorParallel
from executor_svc.sample.grammar import GrammarRows
from executor_svc.sample.graphs import SamplerGraphs
from executor_svc.sample.inputs import SampleInputs
from executor_svc.sample.rows import SamplingRows
from executor_svc.sample.sampler import Sampler
from executor_svc.spec_decode import draft_model
from executor_svc.spec_decode.draft import DraftProposer
from executor_svc.startup import kv_cache, warmup
from executor_svc.worker.cuda_graphs import GraphRunner
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.model_runner import ModelRunner
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import StepLimits
# the tables' widths: logit_bias entries, and the ids min_tokens masks (--max-stop-token-ids' default
# plus the EOS ids), the limits the scheduler refuses above
from llmserve.limits import MAX_LOGIT_BIAS, MAX_MIN_TOKENS_STOP_IDS
from step_protocol.domain import ExecutorInfo

log = logging.getLogger(__name__)
PROFILE_SEQ_LEN = 512  # the profiling step is max_num_batched_tokens as sequences of this length


def build_runner(config: ExecutorConfig, tp: TensorParallel = SINGLE, workers=None) -> ModelRunner:
    """Loads, sizes, allocates and captures what config asks for; returns the runner over it.
    tp (size > 1): this rank's shard; the KV blocks are the fewest any rank fits, and the
    runner's ranks are TensorParallelRanks (parallel/ranks.py; workers: rank 0's other ranks,
    parallel/launch.py)."""
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    if device.type == "cuda":
        prepare_triton(config.cache_dir)
    source = model_source.resolve(config.model, model_source.cache_dir(config.cache_dir), dtype)
    model_path = source.folder
    t0 = time.perf_counter()
    hf_config = loader.load_hf_config(model_path)  # ModelError: not a model folder, or not implemented
    max_model_len = model_checks.served_max_model_len(hf_config, config.max_model_len)  # before the weights
    model = loader.load_model(model_path, device, dtype, hf_config, config.quantization, tp,
                              skinny_max_tokens=config.skinny_max_tokens if device.type == "cuda" else 0,
                              pdl=config.pdl and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9,
                              batch_invariant=config.deterministic)
    log.info("loaded %s in %.2f s", model_path, time.perf_counter() - t0)
    draft = draft_path = None
    if config.speculative_model:  # speculative decoding's draft model (spec_decode/draft.py)
        draft, draft_path = draft_model.load_draft(config, model, model_path, max_model_len, tp.size)
    args = model.args
    limits = StepLimits(config.block_size, max_model_len, config.max_num_seqs,
                        config.max_num_batched_tokens)
    max_blocks_per_seq = -(-max_model_len // config.block_size)
    # before the KV sizing, so that what they hold on the device is not counted as free
    max_logprobs = max(0, min(config.max_logprobs, args.vocab_size))
    sampling = SamplingRows(config.max_num_seqs, args.vocab_size, MAX_LOGIT_BIAS,
                            MAX_MIN_TOKENS_STOP_IDS, device)
    sample_inputs = SampleInputs(config.max_num_seqs, device)
    # the rows' last sampled tokens (+ a scratch row for padded graph rows): the Sampler writes them
    last_tokens = torch.zeros(config.max_num_seqs + 1, dtype=torch.int64, device=device)
    batch = InputBatch(config.max_num_seqs, max_blocks_per_seq)
    buffers = StepBuffers(config.max_num_seqs, config.max_num_batched_tokens, max_blocks_per_seq, device)
    num_blocks = tp.min_over_ranks(measure_num_blocks(config, model, limits, draft))
    cache_dtype = kv_cache.cache_dtype(config.kv_cache_dtype, dtype)
    scales = kv_cache.checkpoint_scales(config.kv_cache_dtype, model.kv_scales, dtype)
    kv_caches = kv_cache.allocate_kv_caches(model.cache_args, num_blocks, config.block_size, cache_dtype, device,
                                            scales)
    log.info("KV cache: %d blocks of %d tokens, %s%s", num_blocks, config.block_size, cache_dtype,
             " (target and draft model)" if draft is not None else "")
    if config.persistent_decode:  # before any graph is captured: the layer table is built here
        try:
            model.persistent = PersistentDecode(model)
        except ValueError as e:
            raise model_checks.ModelError(str(e)) from None
        model.persistent.table(kv_caches)
    drafter = None
    if draft is not None:  # the same block ids and size as the target's: it reuses its block tables
        draft_scales = kv_cache.checkpoint_scales(config.kv_cache_dtype, draft.kv_scales, dtype)
        drafter = DraftProposer(draft, kv_cache.allocate_kv_caches(
            draft.cache_args, num_blocks, config.block_size, cache_dtype, device, draft_scales), batch,
            last_tokens, limits)
    graphs = sampler_graphs = None
    if config.use_cuda_graphs:
        graphs = GraphRunner(model, buffers, kv_caches, last_tokens, config.cuda_graph_sizes,
                             max_model_len, config.mixed_cuda_graph_sizes)
        sampler_graphs = SamplerGraphs(graphs.logits, last_tokens, sample_inputs, sampling.tables,
                                       graphs.sizes, max_logprobs, graphs.pool)
        if drafter is not None:  # its catch-up steps while not speculating (spec_decode/draft.py)
            drafter.capture_graphs(config.cuda_graph_sizes, max_model_len)
    info = ExecutorInfo(
        model_name=config.model_name or source.name, model_path=str(model_path),
        vocab_size=args.vocab_size, eos_token_ids=tuple(loader.eos_token_ids(model_path, hf_config)),
        max_model_len=max_model_len, block_size=config.block_size, num_blocks=num_blocks,
        cuda_graph_sizes=tuple(graphs.sizes) if graphs else (), max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, device=device.type, dtype=config.dtype,
        max_logprobs=max_logprobs, max_logit_bias=MAX_LOGIT_BIAS,
        max_min_tokens_stop_ids=MAX_MIN_TOKENS_STOP_IDS, draft_model_path=str(draft_path or ""))
    grammar = GrammarRows(config.max_num_seqs, args.vocab_size, info.eos_token_ids,
                          Path(model_path) / "tokenizer.json", device)  # structured outputs
    sampler = Sampler(sampling, sample_inputs, last_tokens, sampler_graphs, grammar)
    ranks = None
    if tp.size > 1:
        from executor_svc.parallel.ranks import TensorParallelRanks

        ranks = TensorParallelRanks(tp, workers)
    runner = ModelRunner(model, kv_caches, batch, buffers, sampler, limits, info, graphs, drafter, ranks)
    if tp.size == 1:  # with more ranks, rank 0 warms them all up once they serve (parallel/launch.py)
        warmup.warm_up(runner)
    return runner


def prepare_triton(cache_dir: str) -> None:
    """Before the first Triton compile: its kernel cache under --cache-dir when one is given
    (else Triton's own, ~/.triton/cache or TRITON_CACHE_DIR), and the compile counter."""
    from kernels.jit_cache import jit_counter, set_cache_dir

    if cache_dir:
        log.info("Triton kernel cache: %s", set_cache_dir(os.path.join(cache_dir, "triton")))
    jit_counter()


def measure_num_blocks(config: ExecutorConfig, model: LlamaForCausalLM, limits: StepLimits,
                       draft: LlamaForCausalLM | None = None) -> int:
    """KV blocks that fit: --num-kv-blocks if set; on CPU --cpu-kv-cache-gib; on CUDA the free
    memory under --gpu-memory-utilization minus the activation peak of the largest step. Blocks
    are sized in the cache's dtype (--kv-cache-dtype fp8: 1 byte per element); with a draft
    model a block is the target's plus the draft's (both caches have every block), and the
    peak is the larger of the two models' (they run one after the other)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    cache_dtype = kv_cache.cache_dtype(config.kv_cache_dtype, dtype)
    if device.type != "cuda":
        budget = int(config.cpu_kv_cache_gib * (1 << 30))
    else:
        peak = max(profile_run(m, limits, device, cache_dtype) for m in (model, draft) if m is not None)
        budget = kv_cache.cuda_kv_budget(device, config.gpu_memory_utilization, peak)
    num_blocks = max(0, int(budget) // draft_model.kv_block_bytes(config, model, draft))
    if num_blocks < 2:
        raise RuntimeError(f"no memory left for the KV cache (budget {budget} bytes)")
    return num_blocks


@torch.inference_mode()
def profile_run(model: LlamaForCausalLM, limits: StepLimits, device: torch.device,
                dtype: torch.dtype) -> int:
    """Runs the largest step (max_num_tokens, as sequences of <= PROFILE_SEQ_LEN tokens) over a
    scratch cache of dtype (the KV cache's) and scratch buffers (CUDA); returns the activation peak in bytes above the
    memory resident before it."""
    t, block_size = limits.max_num_tokens, limits.block_size
    seq = min(PROFILE_SEQ_LEN, limits.max_model_len)
    lens = [seq] * (t // seq) + ([t % seq] if t % seq else [])
    blocks_per_seq = -(-seq // block_size)
    caches = kv_cache.allocate_kv_caches(model.cache_args, 1 + blocks_per_seq, block_size, dtype, device)
    buf = StepBuffers(len(lens), t, blocks_per_seq, device)  # input ids 0, use_last False
    pos = np.concatenate([np.arange(n) for n in lens])
    buf.positions.np[:t] = pos
    buf.slot_mapping.np[:t] = block_size + pos  # blocks 1.. of the scratch cache
    buf.block_tables.np[:] = np.arange(1, 1 + blocks_per_seq)  # every sequence: blocks 1..
    buf.seq_lens.np[:] = lens
    buf.query_start_loc.np[:] = np.cumsum([0] + lens)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    buf.copy_to_device(len(lens), t)
    attn = AttentionMetadata.from_buffers(buf, len(lens), t, max_query_len=seq, max_seq_len=seq)
    hidden = model(buf.input_ids.gpu[:t], buf.positions.gpu[:t], attn, caches)  # [T, H]
    model.compute_logits(hidden[: limits.max_num_seqs])
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - base
    del caches, hidden
    return peak
