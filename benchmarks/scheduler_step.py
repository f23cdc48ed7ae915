"""The scheduler core's per-step host work alone, in process, on any CPU: `running` requests
decoding (each step: schedule() the plan, then update_from_output() with a token for every row,
text through the incremental detokenizer of a small local tokenizer), as the engine core's step
loop calls them: the update with its continuing rows' text deferred, then fill_text (which the
loop runs once the next plan has gone out: off the critical path). Prints µs a step for each,
median over the timed steps.

    python -m benchmarks.scheduler_step [--running 512] [--steps 200] [--profile]

Issue 26's target: schedule + apply <= 1.0 ms at 512 running (measured ~2.7 ms through the
services on the H200's host)."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.core.tokenizer import Tokenizer


def build(running: int, vocab: int = 1024) -> tuple[Scheduler, int]:
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="llmserve-sched-"))
    build_tokenizer(folder, vocab, 4096)
    config = SchedulerCoreConfig(num_blocks=running * 40 + 1, block_size=16, max_num_seqs=running,
                                 max_num_batched_tokens=max(8192, running), max_model_len=4096,
                                 long_prefill_token_threshold=2048, eos_token_ids=(2,))
    scheduler = Scheduler(config, Tokenizer.from_pretrained(folder))
    for i in range(running):
        prompt = [3 + (i * 7 + t) % (vocab - 3) for t in range(128)]
        scheduler.add_request(Request(i + 1, prompt, SamplingParams(max_tokens=100_000, temperature=0.6,
                                                                     seed=i, ignore_eos=True)))
    return scheduler, vocab


def run(running: int, steps: int, warmup: int = 20, profile: bool = False) -> dict:
    scheduler, vocab = build(running)
    token = 0
    schedule_us, apply_us, text_us = [], [], []
    profiler = cProfile.Profile() if profile else None
    for step in range(warmup + steps):
        timed = step >= warmup
        if timed and profiler:
            profiler.enable()
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        sampled = {}
        for req_id in plan.scheduled_req_ids:
            token = (token * 1103515245 + 12345) % (vocab - 3)
            sampled[req_id] = 3 + token
        t2 = time.perf_counter()
        outputs = scheduler.update_from_output(plan, sampled, defer_text=True)
        t3 = time.perf_counter()
        scheduler.fill_text(outputs)
        t4 = time.perf_counter()
        if timed and profiler:
            profiler.disable()
        if timed:
            schedule_us.append((t1 - t0) * 1e6)
            apply_us.append((t3 - t2) * 1e6)
            text_us.append((t4 - t3) * 1e6)
    assert len(plan.scheduled_req_ids) == running, "not every request decodes in the timed steps"
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    return dict(running=running, schedule_us=round(statistics.median(schedule_us)),
                apply_us=round(statistics.median(apply_us)), text_us=round(statistics.median(text_us)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--running", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    r = run(args.running, args.steps, profile=args.profile)
    print(f"{r['running']} running: schedule {r['schedule_us']} us + apply {r['apply_us']} us = "
          f"{r['schedule_us'] + r['apply_us']} us a step (median of {args.steps}); "
          f"then the deferred text {r['text_us']} us")


if __name__ == "__main__":
    main()
