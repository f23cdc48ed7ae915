"""What the GPU benchmark sections share: the random model folders (built once), an in-process
runner of one, and one workload set through both services as processes with where a step's
time went (GetServerStatus before and after each workload)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

MODELS = Path("/tmp/llmserve-bench")


def model_path(shape: str) -> Path:
    """Builds (once) a random bf16 model folder of a benchmarks.md shape."""
    import torch

    from executor_svc.model_loader.random_model import build_random_model

    folder = MODELS / shape
    if not (folder / "config.json").exists():
        t = time.perf_counter()
        build_random_model(folder, shape, dtype=torch.bfloat16, device="cuda",
                           max_position_embeddings=4096)
        print(f"built {shape} in {time.perf_counter() - t:.1f} s", flush=True)
    return folder


def runner_for(shape: str, **overrides):
    return runner_for_folder(model_path(shape), **overrides)


def runner_for_folder(folder: Path, **overrides):
    from executor_svc.config import ExecutorConfig
    from executor_svc.startup.build import build_runner

    config = dataclasses.replace(ExecutorConfig.from_args(
        ["--model", str(folder), "--device", "cuda", "--insecure-no-auth"]), **overrides)
    t = time.perf_counter()
    runner = build_runner(config)
    return runner, time.perf_counter() - t


TIMING_FIELDS = ("schedule_us", "apply_us", "apply_deferred_us", "result_wait_us", "executor_queued_us",
                 "executor_launch_us", "executor_launch_cpu_us", "device_idle_us")


def _per_step(before, after) -> dict:
    """Mean µs per step of each StepTimings field (both sides of the step stream) and of the
    device time, between two status answers."""
    steps = max(after.num_steps - before.num_steps, 1)
    out = {f: (getattr(after.step_timings, f) - getattr(before.step_timings, f)) / steps for f in TIMING_FIELDS}
    out["device_us"] = (after.executor_busy_us - before.executor_busy_us) / steps
    return out


def _full_system_run(model: Path, log_dir: Path, scheduler_args: list[str], workloads_: dict,
                     executor_args: tuple[str, ...] = ()) -> dict:
    from benchmarks.client import load
    from benchmarks.cluster import Cluster

    cluster = Cluster(model, log_dir, ["--device", "cuda", *executor_args], scheduler_args, timeout=600)
    results = {}
    try:
        load(cluster.address, [([1, 2, 3], 8)] * 4)  # warm-up
        for name, (workload, temperature) in workloads_.items():
            before, t = cluster.status(), time.perf_counter()
            r = load(cluster.address, workload, temperature)
            after, wall = cluster.status(), time.perf_counter() - t
            busy = (after.executor_busy_us - before.executor_busy_us) / 1e6 / wall
            results[name] = dict(tokens=r.output_tokens, wall_s=r.wall_s, tok_s=r.tokens_per_s,
                                 tpot_ms=r.tpot_ms_median, ttft_ms=r.ttft_ms_median, busy=busy,
                                 steps=after.num_steps - before.num_steps,
                                 graph_steps=after.num_graph_steps - before.num_graph_steps,
                                 per_step=_per_step(before, after))
    finally:
        cluster.stop()
    return results
