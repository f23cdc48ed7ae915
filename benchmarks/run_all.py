"""The GPU benchmark suite: W1-W5 of shared/design/benchmarks.md, peers in the same run, one table.

    python -m benchmarks.run_all --out DIR [--sections w4,full,peers,w5]

Each section runs in its own process (so each gets the whole GPU) and writes DIR/<section>.json;
the last thing printed is the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import (
    MODELS,
    _full_system_run,
    model_path,
    runner_for,
    runner_for_folder,
)

SECTIONS = ("first", "w4", "full", "peers", "w5", "smol", "w7", "w2ab", "w2so", "ab", "w6", "w8", "spec", "intake",
            "det", "detcost")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in ("ab", "detcost"))  # ab needs OLD_TREE; detcost: 4 starts
OLD_TREE = Path(".old/base")  # a checkout of the commit to compare with (w2ab), if present

def section_first(out: dict, log_dir: Path) -> None:
    """The first minute after a start with a fresh --cache-dir against a warm run, and a restart
    on that cache (benchmarks/first_run.py)."""
    from benchmarks import first_run

    out.update(first_run.run(model_path("llama-1b"), log_dir / "first"))
    first_run.report(out)


def section_w4(out: dict) -> None:
    """W4 decode steps, start-up figures, and W1/W2 with the executor in-process (no gRPC)."""
    from benchmarks import decode_step, inprocess, workloads

    runner, startup_s = runner_for("llama-1b")
    graphs = runner.graphs
    out["startup"] = dict(total_s=startup_s, capture_s=getattr(graphs, "capture_s", None),
                          graph_pool_mib=getattr(graphs, "pool_bytes", 0) / 2**20,
                          num_blocks=runner.info().num_blocks, sizes=list(graphs.sizes))
    out["w4"] = [decode_step.measure(runner, b) for b in (1, 8, 32, 64, 128, 256)]
    for b in (1, 256):
        out[f"profile_b{b}"] = decode_step.profile(runner, b)
    for overlap in (True, False):
        tokens, wall, busy = inprocess.run_workload(runner, workloads.w1(), overlap=overlap)
        out[f"inproc_w1_overlap{int(overlap)}"] = dict(tpot_ms=1e3 * wall / tokens, busy=busy)
        tokens, wall, busy = inprocess.run_workload(runner, workloads.w2(), temperature=0.6, overlap=overlap)
        out[f"inproc_w2_overlap{int(overlap)}"] = dict(tokens=tokens, wall_s=wall, tok_s=tokens / wall, busy=busy)


BEFORE_ISSUE_12 = (["--pipeline-depth", "2"], ("--mixed-cuda-graph-sizes", "none"))


def section_full(out: dict, log_dir: Path) -> None:
    """W1, W2, W3 through both services as configured by default; W1, W2 again as before issue
    12 (2 steps in flight, prefill and mixed steps eager), in the same run."""
    from benchmarks import workloads

    model = model_path("llama-1b")
    on = {"w1": (workloads.w1(), 0.0), "w3": (workloads.w3(), 0.0), "w2": (workloads.w2(), 0.6)}
    out["overlap_on"] = _full_system_run(model, log_dir / "on", [], on)
    before = {"w1": (workloads.w1(), 0.0), "w2": (workloads.w2(), 0.6)}
    out["before"] = _full_system_run(model, log_dir / "before", BEFORE_ISSUE_12[0], before, BEFORE_ISSUE_12[1])


def section_peers(out: dict) -> None:
    """transformers generate() at batch 1 (W1) and continuous batching (W3)."""
    from benchmarks import peers_hf, workloads

    model = model_path("llama-1b")
    out["w1"] = peers_hf.w1_generate(model, workloads.w1())
    for name, graphs in (("cb_default", None), ("cb_cuda_graph", True)):
        try:
            out[f"w3_{name}"] = peers_hf.continuous_batching(model, workloads.w3(), graphs)
        except Exception as e:  # a peer failing is a figure we report, not a crash of the suite
            out[f"w3_{name}"] = f"failed: {type(e).__name__}: {e}"[:300]


def section_w5(out: dict) -> None:
    """W5: llama2-7b, requests/s with graphs vs eager, short / medium / long requests."""
    from benchmarks import inprocess, workloads

    runner, _ = runner_for("llama2-7b")
    for total, n in ((128, 16), (512, 16), (2048, 16), (128, 256), (512, 256), (2048, 128)):
        row = {}
        for mode in ("graph", "eager"):
            runner.use_graphs(mode == "graph")
            tokens, wall, _ = inprocess.run_workload(runner, workloads.w5(total, n))
            row[mode] = n / wall
        row["gain"] = row["graph"] / row["eager"] - 1
        out[f"total{total}" if n > 16 else f"total{total}_c16"] = row
    runner.use_graphs(True)


def section_smol(out: dict, log_dir: Path) -> None:
    """The built-in real model (SmolLM2-135M-Instruct) in bf16: agreement with the fp32 CPU
    reference (teacher-forced), graphs vs eager outputs, and W1/W3 through both services."""
    import torch

    from benchmarks import inprocess, real_model, workloads

    folders = real_model.folders(MODELS / "smol-cache")
    prompts = real_model.chat_prompts(folders[torch.float32])
    reference = real_model.reference_continuations(folders[torch.float32], prompts, 48)
    agree, total = real_model.teacher_forced_agreement(folders[torch.bfloat16], "cuda", torch.bfloat16,
                                                       prompts, reference)
    out["agreement"] = dict(agree=agree, total=total, rate=agree / total)
    runner, _ = runner_for_folder(folders[torch.bfloat16])
    graphs = inprocess.greedy_tokens(runner, prompts, 48)
    runner.use_graphs(False)
    out["graph_equals_eager"] = graphs == inprocess.greedy_tokens(runner, prompts, 48)
    del runner
    torch.cuda.empty_cache()
    out["overlap_on"] = _full_system_run(folders[torch.bfloat16], log_dir / "smol", [],
                                         {"w1": (workloads.w1(), 0.0), "w3": (workloads.w3(), 0.0)})


def section_w7(out: dict, log_dir: Path) -> None:
    """W7: multi-turn chat with a shared 1,000-token system prompt, prefix caching on vs off."""
    from benchmarks import w7_prefix

    out.update(w7_prefix.run(model_path("llama-1b"), log_dir / "w7"))


def section_w6(out: dict, log_dir: Path) -> None:
    """W6: chat-like requests arriving as a Poisson process (benchmarks/serving.py) through both
    services; TTFT / TPOT / ITL / E2E and goodput per rate. 300 requests (~48k output tokens) at
    8, 32, 128 req/s (~1.3k, 5k, 20k output tok/s offered; W2 saturates near 35k) and a burst;
    the 8 req/s arrivals (~38 s) take most of the section's time."""
    from benchmarks.cluster import Cluster
    from benchmarks.serving import run_serving

    model = model_path("llama-1b")
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    cluster = Cluster(model, log_dir / "w6", ["--device", "cuda"], [], timeout=600)
    try:
        run_serving(cluster.address, vocab_size, [float("inf")], 32, seed=1)  # warm-up, other prompts
        out["rates"] = run_serving(cluster.address, vocab_size, [8, 32, 128, float("inf")], 300, seed=0)
    finally:
        cluster.stop()


def section_w8(out: dict, log_dir: Path) -> None:
    """W8: FP8 weights and FP8 KV cache vs bf16 (benchmarks/w8_fp8.py)."""
    from benchmarks import w8_fp8

    w8_fp8.run(out, log_dir / "w8")


def section_spec(out: dict, log_dir: Path) -> None:
    """Issue 15: n-gram speculation on the built-in SmolLM2 (bf16) asked to repeat a passage,
    batch 1 and 64, with and without, through both services (benchmarks/spec_bench.py); then
    draft-model speculation, a SmolLM2-135M-shaped random draft (llama-1b's vocabulary and
    tokenizer) for the llama-1b-shaped random target, same task (out["draft_model"])."""
    import torch

    from benchmarks import real_model, spec_bench

    folders = real_model.folders(MODELS / "smol-cache")
    spec_bench.run(out, log_dir / "spec", folders[torch.bfloat16], "cuda")
    out["draft_model"] = {}
    spec_bench.run(out["draft_model"], log_dir / "spec-draft", model_path("llama-1b"), "cuda",
                   draft=model_path("smollm2-135m-draft"))


def section_w2ab(out: dict) -> None:
    """W2 in-process, this tree vs OLD_TREE alternating (features off), and this tree with
    logprobs top-5 and with penalties on every request (benchmarks/w2_features.py)."""
    model_path("llama-1b")
    trees = [(OLD_TREE, "old"), (Path("."), "new")] if OLD_TREE.exists() else [(Path("."), "new")]
    rows = []
    for round_ in range(2):
        for tree, label in trees:
            cmd = [sys.executable, "benchmarks/w2_features.py", str(tree.resolve()), label]
            if label == "new" and round_ == 1:
                cmd.append("--features")
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            line = next((x for x in done.stdout.splitlines() if x.startswith("W2AB ")), None)
            rows.append(json.loads(line[5:]) if line else {"tree": label, "error": done.stderr[-500:]})
    out["rows"] = rows


def section_w2so(out: dict) -> None:
    """W2 in-process with no request, 1 in 8 and every request carrying a JSON schema,
    alternating (benchmarks/w2_structured.py; issue 25: losses <= 10% and <= 25%)."""
    model_path("llama-1b")
    done = subprocess.run([sys.executable, "benchmarks/w2_structured.py"], capture_output=True,
                          text=True, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("W2SO ")), None)
    out.update(json.loads(line[5:]) if line else {"error": done.stderr[-2000:]})


def section_intake(out: dict) -> None:
    """W3's intake on this host's CPUs: both scheduler processes against the fake executor at
    1.5 ms a step, stream pacing on (the default) and off, alternating 3 times
    (benchmarks/scheduler_only.py; ~270 steps when all 512 requests get in at once)."""
    from benchmarks.scheduler_only import run

    out["rows"] = [{"pacing": pacing, **run("w3", 1.5, 1, stream_pacing_ms=ms)}
                   for _ in range(3) for pacing, ms in (("on", None), ("off", 0.0))]


def section_det(out: dict, log_dir: Path) -> None:
    """Issue 28: held-out SmolLM2 requests alone, cached, together and with speculation, default
    mode vs --deterministic: how many differ from the request alone (benchmarks/det_bench.py)."""
    import torch

    from benchmarks import det_bench, real_model

    det_bench.held_out(out, log_dir / "det", real_model.folders(MODELS / "smol-cache")[torch.bfloat16])


def section_detcost(out: dict, log_dir: Path) -> None:
    """Issue 28: W1, W3, W2 through both services, default vs --deterministic, A-B-A-B."""
    from benchmarks import det_bench

    det_bench.cost(out, log_dir / "detcost", model_path("llama-1b"))


def section_ab(out: dict) -> None:
    """W1, W2 and W3 through both services, OLD_TREE and this tree alternating twice
    (AB_ROUNDS times, default 2; benchmarks/ab_full.py: each tree runs its own code)."""
    from benchmarks import ab_full

    model_path("llama-1b")
    if not OLD_TREE.exists():
        raise SystemExit(f"section ab needs a checkout of the commit to compare with in {OLD_TREE}")
    rounds = int(os.environ.get("AB_ROUNDS", "2"))
    out["rows"] = [{"tree": label, "round": r, **ab_full.run_tree(tree)}
                   for r in range(rounds) for label, tree in (("old", OLD_TREE), ("new", Path(".")))]


def run_section(name: str, out_dir: Path) -> None:
    out: dict = {}
    t = time.perf_counter()
    # a SIGTERM (e.g. `timeout`) ends the section with what it measured so far written out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"section {name}: terminated"))
    try:
        if name in ("first", "full", "smol", "w7", "w6", "w8", "spec", "det", "detcost"):
            globals()[f"section_{name}"](out, out_dir)
        else:
            globals()[f"section_{name}"](out)
    finally:
        out["seconds"] = time.perf_counter() - t
        (out_dir / f"{name}.json").write_text(json.dumps(out, indent=1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sections", default=",".join(DEFAULT_SECTIONS))
    p.add_argument("--section", help=argparse.SUPPRESS)  # internal: run one section here
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section:
        run_section(args.section, args.out)
        return
    for name in args.sections.split(","):
        print(f"=== section {name}", flush=True)
        code = subprocess.call([sys.executable, "-m", "benchmarks.run_all", "--out", str(args.out),
                                "--section", name])
        if code:
            print(f"section {name} failed with exit code {code}", flush=True)
    from benchmarks.report import print_table

    print_table(args.out)


if __name__ == "__main__":
    main()
