"""Where the executor's host time goes when it launches a decode step (issue 12).

    python -m benchmarks.launch_profile [--json OUT] [--device cpu]

With --device cpu (any machine): a tiny random model, short contexts; the forward is the eager
CPU reference, so only the host phases (plan checks + rows, inputs, copies) say anything, and
they are what A-B comparisons of the host path read.

Builds the llama-1b runner (random bf16, CUDA graphs), admits `batch` requests, then launches
decode steps the way the pipelined executor does (step N+1 launched before step N is
finished) and times each phase of ModelRunner.launch with perf_counter wrappers around its
methods: plan checks + row updates, input preparation, shape choice + copies, forward
(graph replay), sampling, and the rest. Host microseconds per step, medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from step_protocol.domain import CachedRequestData, StepPlan

PHASES = ("_apply", "_prepare", "_copy_inputs", "_forward", "sampler.sample")


def _owner(runner, name: str):
    """(object, attribute) of a phase: a runner method, or "sampler.sample"."""
    *path, attr = name.split(".")
    owner = runner
    for part in path:
        owner = getattr(owner, part)
    return owner, attr


def _wrap(runner, name: str, acc: dict) -> None:
    owner, attr = _owner(runner, name)
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            acc[name].append((time.perf_counter() - t) * 1e6)

    setattr(owner, attr, timed)


def profile_launch(runner, batch: int, steps: int = 50, context: int = 512) -> dict:
    from benchmarks.decode_step import _prefill

    step_id = _prefill(runner, batch, context, 50_000, 50_000)
    ids = list(range(50_000, 50_000 + batch))
    acc: dict[str, list[float]] = defaultdict(list)
    for name in PHASES:
        _wrap(runner, name, acc)
    launches, prev = [], None
    for s in range(steps):
        plan = StepPlan(step_id=step_id, cached_requests=CachedRequestData.decode_rows(ids))
        step_id += 1
        t = time.perf_counter()
        handle = runner.launch(plan)
        launches.append((time.perf_counter() - t) * 1e6)
        if prev is not None:
            runner.finish(prev)
        prev = handle
    runner.finish(prev)
    for name in PHASES:
        owner, attr = _owner(runner, name)
        del owner.__dict__[attr]  # the class methods again
    runner.execute(StepPlan(step_id=step_id, finished_req_ids=ids))
    skip = 10
    row = {name: statistics.median(acc[name][skip:]) for name in PHASES}
    row["launch_total"] = statistics.median(launches[skip:])
    row["other"] = row["launch_total"] - sum(row[n] for n in PHASES)
    return row


def replay_cost(runner, batch: int, reps: int = 200) -> float:
    """Host µs of one bare graph.replay() of the decode graph of `batch`."""
    graphs = runner.graphs
    shape = next(s for s in graphs.decode_shapes if s.num_reqs >= batch)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        graphs.replay(shape)
        times.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times[10:])


def _cpu_runner():
    """A tiny random llama on the CPU, rows enough for 256 requests of short contexts."""
    import tempfile

    from executor_svc.config import ExecutorConfig
    from executor_svc.model_loader.random_model import build_random_model
    from executor_svc.startup.build import build_runner

    folder = build_random_model(tempfile.mkdtemp(), "tiny-llama", vocab_size=2048, max_position_embeddings=4096)
    return build_runner(ExecutorConfig.from_args(["--model", str(folder), "--device", "cpu", "--insecure-no-auth",
                                                  "--max-num-seqs", "512", "--num-kv-blocks", "40000"]))


def main() -> None:
    from benchmarks.harness import runner_for

    p = argparse.ArgumentParser()
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = p.parse_args()
    cuda = args.device == "cuda"
    runner = runner_for("llama-1b")[0] if cuda else _cpu_runner()
    rows = {}
    for batch in (1, 64, 256):
        row = profile_launch(runner, batch, context=512 if cuda else 32)
        if cuda:
            row["bare_replay"] = replay_cost(runner, batch)
        rows[batch] = row
        print(f"b={batch:4d} " + " ".join(f"{k.strip('_')} {v:.0f}" for k, v in row.items()), flush=True)
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    profile_launch(runner, 1, steps=50, context=512 if cuda else 32)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
