"""The scheduler process's own ceiling, on any CPU machine: both scheduler processes against
benchmarks/fake_executor.py (a fixed time per step), loaded by the gRPC client.

    python -m benchmarks.scheduler_only [--workload w3] [--step-ms 4] [--stream-interval 1] [--stream-pacing-ms 50]

Prints output tokens/s and what a perfectly fed executor would give (steps x step time).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks import workloads
from benchmarks.client import load
from benchmarks.cluster import Cluster


def run(workload_name: str, step_ms: float, stream_interval: int, num_requests: int | None = None,
        stream_pacing_ms: float | None = None, max_num_seqs: int = 256) -> dict:
    from executor_svc.model_loader.random_model import build_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="llmserve-fake-"))
    build_tokenizer(tmp, 1024, 4096)
    workload = getattr(workloads, workload_name)()
    if num_requests:
        workload = workload[:num_requests]
    workload = [([3 + t % 1000 for t in prompt], n) for prompt, n in workload]  # fit the fake vocab
    cluster = Cluster(tmp, tmp / "logs", ["--step-ms", str(step_ms), "--max-num-seqs", str(max_num_seqs)],
                      ["--stream-interval", str(stream_interval),
                       *([] if stream_pacing_ms is None else ["--stream-pacing-ms", str(stream_pacing_ms)])],
                      executor_module="benchmarks.fake_executor")
    try:
        load(cluster.address, [([5, 6, 7], 4)] * 4)  # warm-up
        before = cluster.status()
        r = load(cluster.address, workload)
        after = cluster.status()
        steps = after.num_steps - before.num_steps
    finally:
        cluster.stop()
    per_step = {f: (getattr(after.step_timings, f) - getattr(before.step_timings, f)) / max(steps, 1)
                for f in ("schedule_us", "apply_us", "result_wait_us")}
    return dict(tokens=r.output_tokens, tok_s=r.tokens_per_s, wall_s=r.wall_s, steps=steps,
                ttft_ms=(r.ttft_ms_median, r.ttft_ms_p90),
                ideal_tok_s=r.output_tokens / (steps * step_ms / 1e3), per_step=per_step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="w3", choices=["w1", "w2", "w3"])
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--stream-pacing-ms", type=float, default=None, help="the scheduler's default if not given")
    p.add_argument("--max-num-seqs", type=int, default=256, help="the fake executor's rows a step")
    args = p.parse_args()
    r = run(args.workload, args.step_ms, args.stream_interval, stream_pacing_ms=args.stream_pacing_ms,
            max_num_seqs=args.max_num_seqs)
    print(f"{args.workload}: {r['tok_s']:,.0f} tok/s over {r['steps']} steps "
          f"(a perfectly fed {args.step_ms} ms executor: {r['ideal_tok_s']:,.0f} tok/s), wall {r['wall_s']:.2f} s, "
          f"TTFT p50/p90 {r['ttft_ms'][0]:.0f}/{r['ttft_ms'][1]:.0f} ms; per step: "
          + ", ".join(f"{k} {v:.0f}" for k, v in r["per_step"].items()))


if __name__ == "__main__":
    main()
