"""Warm-up at start (after graph capture): runs the plans of warmup_plans.py through the runner
(`execute`: every check and path as serving runs them), `reset`s it after each scenario, and
logs what it took and what Triton compiled at start-up; from then on a compile is a warning
(kernels/jit_cache.py). Nothing runs on CPU (no Triton there)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from pathlib import Path

from executor_svc.startup.warmup_plans import MARGIN, WarmupPlans, WarmupShapes

log = logging.getLogger(__name__)


def warm_up(runner, on_cpu: bool = False) -> None:
    """Runs the warm-up scenarios through `runner` (a ModelRunner, as start-up built it), resets
    it after each, and logs what it took and what Triton compiled at start-up (capture included);
    from then on a compile is logged as a warning (kernels/jit_cache.py). A no-op on CPU unless
    on_cpu (the tests of the plans)."""
    if runner.device.type != "cuda" and not on_cpu:
        return
    from kernels.jit_cache import jit_counter

    counter = jit_counter() if runner.device.type == "cuda" else None
    before = counter.compiled if counter is not None else 0
    t0 = time.perf_counter()
    scenarios = WarmupPlans(shapes_of(runner)).scenarios()
    slowest = (0.0, -1)
    for k, plans in enumerate(scenarios):
        t = time.perf_counter()
        try:
            for plan in plans:
                out = runner.execute(plan)
                if out.failed_req_ids:
                    log.warning("warm-up step %d: rows failed: %s", plan.step_id, out.failed_errors)
        finally:
            runner.reset()
        slowest = max(slowest, (time.perf_counter() - t, k))
    log.info("warm-up: %d steps in %.1f s (the slowest, scenario %d of %d: %.1f s)", sum(len(p) for p in scenarios),
             time.perf_counter() - t0, slowest[1], len(scenarios), slowest[0])
    if counter is not None:
        counter.serving = True
        log.info("Triton kernel variants compiled at start-up: %d (%d by the warm-up), %d of them found in "
                 "the disk cache", counter.compiled, counter.compiled - before, counter.from_disk)


def shapes_of(runner) -> WarmupShapes:
    """The shapes of `runner`: its limits, KV blocks, graphs and its kernels' decode variants."""
    info, graphs = runner.info(), runner.graphs
    avail = min(info.num_blocks - 1, runner.batch.max_blocks_per_seq) * info.block_size
    grammar = ""
    if (Path(info.model_path) / "tokenizer.json").is_file():
        from llmserve.structured import regex, to_grammar

        # complete only past MARGIN tokens: warm-up plans sample on past EOS (serving refuses
        # ignore_eos with a grammar), where a complete grammar's mask allows nothing
        grammar = to_grammar(regex(f"[0-9]{{{2 * MARGIN},{4 * MARGIN}}}", "warm-up"))
    return WarmupShapes(
        max_num_seqs=info.max_num_seqs, max_num_tokens=info.max_num_batched_tokens,
        max_tokens_per_req=min(avail, info.max_model_len) - MARGIN, block_size=info.block_size,
        vocab_size=info.vocab_size, max_logprobs=info.max_logprobs,
        decode_sizes=tuple(graphs.sizes) if graphs else (), mixed_sizes=tuple(graphs.mixed_sizes) if graphs else (),
        draft_model=bool(info.draft_model_path), grammar=grammar, decode_key=decode_key(runner))


def decode_key(runner) -> Callable[[int], Hashable] | None:
    """Batch size -> the decode attention variants it launches (the target's and the draft
    model's, per sliding window); None on CPU."""
    if runner.device.type != "cuda":
        return None
    import torch

    from kernels.attention_decode import decode_variant

    max_context = runner.batch.max_blocks_per_seq * runner.info().block_size
    models = [(runner.model, runner.kv_caches)]
    if runner.drafter is not None:
        models.append((runner.drafter.model, runner.drafter.kv_caches))
    launches = set()
    for model, caches in models:
        args, fp8 = model.cache_args, caches[0].k.dtype == torch.float8_e4m3fn
        for window in set(args.layer_windows or (0,)):
            context = min(max_context, window) if window else max_context
            launches.add((args.num_kv_heads, context, args.head_dim, fp8))
    return lambda b: tuple(decode_variant(b, *launch, runner.device) for launch in sorted(launches))
