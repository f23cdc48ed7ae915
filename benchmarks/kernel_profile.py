"""Issue 27, part 1: where one decode step's device time goes, kernel by kernel.

    python -m benchmarks.kernel_profile [--shapes llama-1b,smollm2-135m-draft] [--batches 1,8,64,256] [--json OUT]

For each model shape (random bf16 weights) and batch: requests prefilled to a 512-token context,
then decode steps replayed from their CUDA graph under torch.profiler (CUPTI records the kernels
a graph launches); per kernel name: device µs a step, launches a step and its share of the step.
Beside them: the step's kernel time in all, and its floor (every weight read once, plus the
context's KV, at the H200's measured copy bandwidth; benchmarks/decode_step.py).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from benchmarks.decode_step import HBM_BYTES_PER_S, _prefill, kv_bytes_per_token, weight_bytes
from step_protocol.domain import CachedRequestData, StepPlan


def profile_step(runner, batch: int, context: int = 512, steps: int = 20, first_id: int = 1) -> dict:
    step_id = _prefill(runner, batch, context, first_id, 1_000_000 + first_id)
    ids = list(range(first_id, first_id + batch))
    for _ in range(3):  # warm: the steady path, the graph
        runner.execute(StepPlan(step_id=step_id, cached_requests=CachedRequestData.decode_rows(ids)))
        step_id += 1
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            runner.execute(StepPlan(step_id=step_id, cached_requests=CachedRequestData.decode_rows(ids)))
            step_id += 1
        torch.cuda.synchronize()
    runner.execute(StepPlan(step_id=step_id, finished_req_ids=ids))
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:90]]
            k[0] += e.time_range.elapsed_us()
            k[1] += 1
    total = sum(us for us, _ in kernels.values()) / steps
    floor = (weight_bytes(runner) + batch * context * kv_bytes_per_token(runner)) / HBM_BYTES_PER_S * 1e6
    rows = sorted(((name, us / steps, n / steps) for name, (us, n) in kernels.items()), key=lambda r: -r[1])
    return {"batch": batch, "kernel_us": total, "floor_us": floor, "launches": sum(r[2] for r in rows),
            "kernels": [{"name": n, "us": us, "per_step": c, "share": us / total if total else 0.0} for n, us, c in rows]}


def main() -> None:
    from benchmarks.harness import runner_for

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="llama-1b,smollm2-135m-draft")
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--json")
    p.add_argument("--no-pdl", action="store_true",
                   help="plain launches: a dependent launch starts early and waits, so its span overstates it")
    args = p.parse_args()
    out = {}
    for shape in args.shapes.split(","):
        runner = runner_for(shape, **({"pdl": False} if args.no_pdl else {}))[0]
        out[shape] = []
        for i, b in enumerate(int(x) for x in args.batches.split(",")):
            r = profile_step(runner, b, first_id=1 + 10_000 * i)
            out[shape].append(r)
            print(f"PROFILE {shape} b={b}: kernels {r['kernel_us']:.0f} us a step ({r['launches']:.0f} launches), "
                  f"floor {r['floor_us']:.0f} us ({r['kernel_us'] / r['floor_us']:.2f}x)", flush=True)
            for k in r["kernels"][:args.top]:
                print(f"  {k['us']:8.1f} us {k['per_step']:5.1f}x {100 * k['share']:5.1f}%  {k['name']}", flush=True)
        del runner
        import gc

        gc.collect()  # the next shape's KV-cache budget counts what this one still holds
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
