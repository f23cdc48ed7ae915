"""What a speculative verify step costs against a decode step, in one process (no gRPC): the
scheduler core driving a ModelRunner through the engine's step loop (benchmarks/inprocess.py),
speculation forced on (every request speculates whatever its acceptance, and a lookup that
finds nothing proposes its last token k times; no mode trials), so every decode row is a
verify row of k drafts and the figures are the mechanism's cost, not its payoff.

    python -m benchmarks.spec_step_cost [--model FOLDER] [--device cpu|cuda] [--batches 1 64]
                                        [--temperature 0 1] [--max-tokens 64]

Per temperature, batch and mode (off: pipelined decode at depth 3; on: n-gram verify rows of k = 4): wall
per step, the executor's host time per step (prepare, launch and its thread CPU time) and its device time (forward +
sample, from its timer), and the scheduler's schedule / apply time per step. Without --model a
tiny random model is built on the CPU (host costs dominate there; see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from benchmarks.inprocess import InProcessTransport
from llmserve.speculative import SpecDecodeConfig
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.core.spec import gate as spec_gate
from scheduler_svc.core.spec.ngram import NgramIndex
from scheduler_svc.engine.step_loop import LoopTimings, StepLoop

SPEC = SpecDecodeConfig("ngram", num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=1)
FIELDS = ("prepare_us", "launch_us", "launch_cpu_us", "forward_us", "sample_us")


def measure(runner, batch: int, spec: SpecDecodeConfig | None, max_tokens: int = 64,
            temperature: float = 1.0, profile=None) -> dict:
    """profile: a cProfile.Profile enabled around each launch only (its Python and torch calls)."""
    runner.reset()
    info = runner.info()
    core = SchedulerCoreConfig(num_blocks=info.num_blocks, block_size=info.block_size,
                               max_num_seqs=info.max_num_seqs, max_num_batched_tokens=info.max_num_batched_tokens,
                               max_model_len=info.max_model_len, eos_token_ids=(), speculative=spec)
    scheduler = Scheduler(core, clock=lambda: 0.0)  # no mode trials
    prompt = [5, 6, 7, 8] * 8  # repeats: the lookup always finds drafts
    for i in range(batch):
        scheduler.add_request(Request(i, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                                  temperature=temperature)))
    results, launch = [], runner.launch

    def recording(plan, *args, **kw):
        if profile is not None:
            profile.enable()
        try:
            handle = launch(plan, *args, **kw)
        finally:
            if profile is not None:
                profile.disable()
        results.append((plan, handle))
        return handle

    timings = LoopTimings()
    loop = StepLoop(scheduler, InProcessTransport(runner), 3, lambda outputs, errors: None, timings=timings)
    runner.launch = recording
    t0 = time.perf_counter()
    try:
        asyncio.run(loop.run_until_idle())
    finally:
        del runner.launch
    wall = time.perf_counter() - t0
    steps = [h.out for p, h in results[1:]]  # the prefill left out
    n = max(len(steps), 1)
    out = dict(batch=batch, steps=len(results), wall_per_step_us=1e6 * wall / len(results),
               verify_steps=sum(bool(p.num_draft_tokens) for p, _ in results),
               chained_rows=sum(sum(p.draft_chained) for p, _ in results),
               tokens_per_s=batch * max_tokens / wall,
               schedule_us=timings.schedule_us / len(results), apply_us=timings.apply_us / len(results))
    out.update({f: sum(getattr(s, f) for s in steps) / n for f in FIELDS})
    return out


_lookup = NgramIndex.propose


def _always(index, between, length, k):  # a lookup that finds nothing proposes anyway
    return _lookup(index, between, length, k) or between(length - 1, length) * k


def compare(runner, batches, max_tokens: int = 64, temperature: float = 1.0) -> list[dict]:
    """measure() off and on (forced) for each batch, after a short warm-up of each."""
    rows = []
    with mock.patch.object(spec_gate, "MIN_ACCEPTED", 0.0), mock.patch.object(NgramIndex, "propose", _always):
        for b in batches:
            for mode, spec in (("off", None), ("on", SPEC)):
                measure(runner, b, spec, 8, temperature)  # warm-up
                rows.append(dict(mode=mode, **measure(runner, b, spec, max_tokens, temperature)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    p.add_argument("--temperature", type=float, nargs="+", default=[1.0],
                   help="0: greedy rows (the n-gram target's task); several: each in turn")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens a request generates in a measured run")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="then profile the launches of one more 'on' run per batch: the N costliest calls by own time")
    p.add_argument("--json", default="")
    args = p.parse_args()
    from executor_svc.config import ExecutorConfig
    from executor_svc.model_loader.random_model import build_random_model
    from executor_svc.startup.build import build_runner

    model = args.model or str(build_random_model(Path(tempfile.mkdtemp()) / "tiny", "tiny-llama"))
    # room for every verify token as a logits row and a decode-graph row (token rows): as served,
    # where max_num_seqs (256) exceeds a small batch's 1 + k tokens a row
    seqs = max(args.batches) * (1 + SPEC.num_speculative_tokens)
    runner = build_runner(ExecutorConfig.from_args(["--model", model, "--device", args.device,
                                                    "--max-num-seqs", str(seqs), "--insecure-no-auth"]))
    rows = [dict(temperature=t, **row) for t in args.temperature
            for row in compare(runner, args.batches, args.max_tokens, t)]
    for row in rows:
        print(f"b={row['batch']:<3} T={row['temperature']:<3g} {row['mode']:<3} steps {row['steps']:>4} (verify {row['verify_steps']:>3}, "
              f"chained rows {row['chained_rows']:>3}) "
              f"wall/step {row['wall_per_step_us']:>8.0f} us  prepare {row['prepare_us']:>6.0f}  "
              f"launch {row['launch_us']:>7.0f} (cpu {row['launch_cpu_us']:>6.0f})  device {row['forward_us'] + row['sample_us']:>7.0f}  "
              f"schedule {row['schedule_us']:>6.0f}  apply {row['apply_us']:>6.0f}  "
              f"{row['tokens_per_s']:>8.0f} tok/s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    for b in args.batches if args.profile else ():
        profile_launches(runner, b, args.temperature[-1], args.profile)


def profile_launches(runner, batch: int, temperature: float, top: int) -> None:
    """cProfile of the launches of a forced-on run: where a verify step's host time goes."""
    profile = cProfile.Profile()
    with mock.patch.object(spec_gate, "MIN_ACCEPTED", 0.0), mock.patch.object(NgramIndex, "propose", _always):
        row = measure(runner, batch, SPEC, 64, temperature, profile)
    print(f"--- b={batch} on: launches profiled ({row['steps']} steps), the {top} costliest calls by own time")
    stats = pstats.Stats(profile, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    main()
