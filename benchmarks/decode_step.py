"""W4: one decode step in isolation (ModelRunner in-process), eager vs CUDA graph, vs the floor."""

from __future__ import annotations

import statistics

import torch

from executor_svc.worker.model_runner import ModelRunner
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan

HBM_BYTES_PER_S = 4.25e12  # device-to-device copy bandwidth measured on the H200


def weight_bytes(runner: ModelRunner) -> int:
    return sum(p.numel() * p.element_size() for p in runner.model.parameters())


def kv_bytes_per_token(runner: ModelRunner) -> int:
    k_cache = runner.kv_caches[0].k
    per_layer = k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size() * 2
    return per_layer * len(runner.kv_caches)


def _prefill(runner: ModelRunner, batch: int, context: int, first_id: int, step_id: int) -> int:
    """Admits `batch` requests with `context - 1` prompt tokens each; returns the next step id."""
    info = runner.info()
    blocks_per_req = -(-(context + 64) // info.block_size)
    per_step = max(1, info.max_num_batched_tokens // context)
    for start in range(0, batch, per_step):
        news = []
        for i in range(start, min(batch, start + per_step)):
            first_block = 1 + i * blocks_per_req
            news.append(NewRequestData(
                req_id=first_id + i, token_ids=[(7 * i + j) % 1000 + 3 for j in range(context - 1)],
                sampler_params=SamplerParams(temperature=0.0),
                block_ids=list(range(first_block, first_block + blocks_per_req)),
                num_computed_tokens=0, num_scheduled_tokens=context - 1))
        runner.execute(StepPlan(step_id=step_id, new_requests=news))
        step_id += 1
    return step_id


def measure(runner: ModelRunner, batch: int, context: int = 512, steps: int = 30,
            bytes_per_s: float = HBM_BYTES_PER_S) -> dict:
    """Median wall and device time of a decode step at `batch` rows, graph and eager; the floor at
    bytes_per_s (the H200's copy bandwidth unless given)."""
    step_id = _prefill(runner, batch, context, 1, 1)
    ids = list(range(1, batch + 1))
    rows = {}
    for mode in ("graph", "eager"):
        runner.use_graphs(mode == "graph")
        walls, devs, sizes = [], [], set()
        for s in range(steps):
            plan = StepPlan(step_id=step_id, cached_requests=CachedRequestData.decode_rows(ids))
            step_id += 1
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = runner.execute(plan)
            end.record()
            end.synchronize()
            if s >= 3:
                walls.append(start.elapsed_time(end))
                devs.append((out.forward_us + out.sample_us) / 1e3)
            sizes.add(out.graph_size)
        rows[mode] = dict(step_ms=statistics.median(walls), device_ms=statistics.median(devs),
                          graph_sizes=sorted(sizes))
    runner.use_graphs(True)
    runner.execute(StepPlan(step_id=step_id, finished_req_ids=ids))
    kv = batch * (context + steps) * kv_bytes_per_token(runner)
    floor_ms = 1e3 * (weight_bytes(runner) + kv) / bytes_per_s
    return dict(batch=batch, context=context, floor_ms=floor_ms, **{
        f"{m}_{k}": v for m, r in rows.items() for k, v in r.items()})


def profile(runner: ModelRunner, batch: int, context: int = 512, steps: int = 5) -> str:
    """Top kernels by device time over a few graph-replayed decode steps (torch.profiler table)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step_id = _prefill(runner, batch, context, 10_000, 10_000)
    ids = list(range(10_000, 10_000 + batch))
    plans = [StepPlan(step_id=step_id + s, cached_requests=CachedRequestData.decode_rows(ids))
             for s in range(steps + 1)]
    runner.execute(plans[0])  # warm-up
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for plan in plans[1:]:
            runner.execute(plan)
    runner.execute(StepPlan(step_id=step_id + steps + 1, finished_req_ids=ids))
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
