"""W2 in-process on one tree, with the sampling surface off (and, with --features, logprobs
top-5 and penalties on every request): what the features cost, and what they cost when off.

    python benchmarks/w2_features.py TREE LABEL [--features] [--reps N]

TREE goes first on sys.path, so an older checkout (e.g. .old/base) measures itself; prints one
JSON line. run_all's `w2ab` section alternates trees in one call (benchmarks/METHOD: A/B in the
same run, alternating)."""

import argparse
import json
import statistics
import sys

p = argparse.ArgumentParser()
p.add_argument("tree")
p.add_argument("label")
p.add_argument("--features", action="store_true")
p.add_argument("--reps", type=int, default=3)
args = p.parse_args()
sys.path.insert(0, args.tree)

from benchmarks import inprocess, workloads  # noqa: E402  (from TREE)
from executor_svc.config import ExecutorConfig  # noqa: E402
from executor_svc.startup.build import build_runner  # noqa: E402

MODEL = "/tmp/llmserve-bench/llama-1b"  # built by harness.model_path before this runs
runner = build_runner(ExecutorConfig.from_args(["--model", MODEL, "--device", "cuda", "--insecure-no-auth"]))
inprocess.run_workload(runner, workloads.w2(64), temperature=0.6)  # warm-up


def tok_s(reps: int, **params) -> list[float]:
    out = []
    for _ in range(reps):
        tokens, wall, _ = inprocess.run_workload(runner, workloads.w2(), temperature=0.6, **params)
        out.append(round(tokens / wall, 1))
    return out


row = {"tree": args.label, "off": tok_s(args.reps)}
if args.features:
    row["logprobs5"] = tok_s(args.reps, logprobs=5)
    row["penalties"] = tok_s(args.reps, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
for key in ("off", "logprobs5", "penalties"):
    if key in row:
        row[key + "_median"] = statistics.median(row[key])
print("W2AB " + json.dumps(row), flush=True)
