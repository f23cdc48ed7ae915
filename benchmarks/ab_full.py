"""W1, W2 and W3 through both services, two trees alternating (A-B-A-B) in one call, each tree
running its own code (its own benchmarks.harness): lent machines differ by 30% or more, so a
change is measured against the previous commit in the same call and quoted as a ratio.

    python benchmarks/ab_full.py OLD_TREE NEW_TREE [--rounds 2] [--json out.json] [--new-args "--flag ..."]
        [--workloads w1,w3]   # which of W1, W2, W3 (all by default)
    python benchmarks/ab_full.py OLD_TREE NEW_TREE --what spec     # n-gram speculation, batch 1 (spec_bench)

--new-args: executor flags of the new tree's runs only (OLD_TREE = NEW_TREE = . compares a flag).
--what spec: the spec section's repeat-passage task at batch 1 on the built-in SmolLM2 (bf16;
LLMSERVE_SMOLLM2_GGUF), off and on in each tree: TPOT, speedup and the verify steps' host figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Run inside a tree: its own harness, workloads and services (stdout's last line is the JSON).
ONE_RUN = """
import json, os, sys, tempfile
from pathlib import Path
from benchmarks import workloads
from benchmarks.harness import _full_system_run, model_path
model = model_path("llama-1b")
runs = {"w1": (workloads.w1(), 0.0), "w2": (workloads.w2(), 0.6), "w3": (workloads.w3(), 0.0)}
runs = {k: v for k, v in runs.items() if k in os.environ.get("AB_WORKLOADS", "w1,w2,w3").split(",")}
extra = tuple(os.environ.get("AB_EXECUTOR_ARGS", "").split())
out = _full_system_run(model, Path(tempfile.mkdtemp()), [], runs, executor_args=extra)
print("ABRUN " + json.dumps(out))
"""

SPEC_RUN = """
import json, os, tempfile
from pathlib import Path
import torch
from benchmarks import real_model, spec_bench
folder = real_model.folders(Path(tempfile.gettempdir()) / "ab-smol")[torch.bfloat16]
out = {}
extra = tuple(os.environ.get("AB_EXECUTOR_ARGS", "").split())
spec_bench.run(out, Path(tempfile.mkdtemp()), folder, "cuda", batches=(1,), executor_args=extra)
print("ABRUN " + json.dumps(out))
"""


def run_tree(tree: Path, executor_args: str = "", code: str = ONE_RUN, workloads: str = "w1,w2,w3") -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=600,
                          env={**_env(tree), "AB_EXECUTOR_ARGS": executor_args, "AB_WORKLOADS": workloads})
    line = next((x for x in done.stdout.splitlines() if x.startswith("ABRUN ")), None)
    if line is None:
        return {"error": (done.stdout + done.stderr)[-800:]}
    return json.loads(line[6:])


def _env(tree: Path) -> dict:
    """This environment with `tree` first on PYTHONPATH, in place of this tree (the wheels
    gpu_suite.sh installs stay on it)."""
    here = str(Path(__file__).resolve().parents[1])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(here)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree.resolve()), *rest])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--new-args", default="", help="executor flags of the new tree's runs")
    p.add_argument("--what", choices=("serve", "spec"), default="serve")
    p.add_argument("--workloads", default="w1,w2,w3", help="serve: which of w1,w2,w3")
    args = p.parse_args()
    rows = []
    for round_ in range(args.rounds):
        for label, tree in (("old", args.old), ("new", args.new)):
            r = run_tree(tree, args.new_args if label == "new" else "", SPEC_RUN if args.what == "spec" else ONE_RUN,
                         args.workloads)
            rows.append({"tree": label, "round": round_, **r})
            if "error" in r:
                print(f"{label} round {round_}: failed\n{r['error']}", flush=True)
                continue
            if args.what == "spec":
                print_spec(label, round_, r)
                continue
            print(f"AB {label} r{round_}: " + " | ".join(_serve_line(k, r[k]) for k in ("w1", "w2", "w3") if k in r),
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _serve_line(name: str, w: dict) -> str:
    s = w["per_step"]
    launch = f"launch {s.get('executor_launch_us', 0):.0f} (cpu {s.get('executor_launch_cpu_us', 0):.0f}) us"
    if name == "w1":
        return (f"W1 TPOT {w['tpot_ms']:.3f} ms ({launch}, device {s['device_us']:.0f} us, idle "
                f"{s.get('device_idle_us', 0):.0f}, queued {s.get('executor_queued_us', 0):.0f})")
    if name == "w2":
        return (f"W2 {w['tok_s']:,.0f} tok/s ({launch}, schedule {s.get('schedule_us', 0):.0f}, apply "
                f"{s.get('apply_us', 0):.0f})")
    return (f"W3 {w['tok_s']:,.0f} tok/s ({w['steps']} steps: ~270 when all 512 get in at once; {launch}, idle "
            f"{s.get('device_idle_us', 0):.0f} us)")


def print_spec(label: str, round_: int, r: dict) -> None:
    off, on = r["off"]["b1"], r["on"]["b1"]
    step = {k: on["per_step"].get(k, 0) for k in ("executor_launch_us", "executor_launch_cpu_us", "device_us",
                                                 "device_idle_us", "executor_queued_us")}
    print(f"AB {label} r{round_}: TPOT off {off['tpot_ms']:.3f} -> on {on['tpot_ms']:.3f} ms, "
          f"{r['tpot_speedup']['b1']:.2f}x (outputs equal: {r['outputs']['b1']['equal']}; acceptance length "
          f"{on['acceptance_length'] or 0:.2f}, {on['steps']} steps) | on, a step: launch {step['executor_launch_us']:.0f} "
          f"(cpu {step['executor_launch_cpu_us']:.0f}) us, device {step['device_us']:.0f}, idle "
          f"{step['device_idle_us']:.0f}, queued {step['executor_queued_us']:.0f}", flush=True)


if __name__ == "__main__":
    main()
