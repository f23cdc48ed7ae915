"""The first minute against the tenth (issue 26, part 5): both services started with a fresh
`--cache-dir` (nothing compiled yet for this tree: Triton's kernel cache lives under it), W1, W2
and W3 sent with no warm-up, then the same WARM_RUNS times more on the same servers (warm: the
median), then both services restarted on the same cache dir (kernels from disk) and once more.

    python -m benchmarks.first_run [--json OUT] [--model FOLDER]

Prints, per start: seconds until serving, graph capture seconds, Triton kernels compiled at
start-up (and how many of them came from the disk cache), W1 TPOT, W2 and W3 tok/s.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

CAPTURED = re.compile(r"captured \d+ CUDA graphs .* in ([0-9.]+) s")
COMPILED = re.compile(r"Triton kernel variants compiled at start-up: (\d+) \((\d+) by the warm-up\), (\d+) of them")
WARM_RUNS = 3  # warm figures: the median of this many runs on the same servers
COMPILED_LATER = re.compile(r"compiling a Triton kernel variant while serving")


def _start(model: Path, cache: Path, log_dir: Path):
    from benchmarks.cluster import Cluster

    t = time.perf_counter()
    cluster = Cluster(model, log_dir, ["--device", "cuda", "--cache-dir", str(cache)], [], timeout=600)
    start_s = time.perf_counter() - t
    log = cluster.logs(tail=None)
    cap, comp = CAPTURED.search(log), COMPILED.search(log)
    return cluster, dict(start_s=start_s, capture_s=float(cap.group(1)) if cap else None,
                         compiled=int(comp.group(1)) if comp else None,
                         from_disk=int(comp.group(3)) if comp else None)


def _workloads(cluster) -> dict:
    from benchmarks import workloads
    from benchmarks.client import load

    out = {}
    for name, workload, temperature in (("w1", workloads.w1(), 0.0), ("w2", workloads.w2(), 0.6),
                                        ("w3", workloads.w3(), 0.0)):
        r = load(cluster.address, workload, temperature)
        out[name] = dict(tpot_ms=r.tpot_ms_median, tok_s=r.tokens_per_s, ttft_ms=r.ttft_ms_median)
    return out


def _median_of(runs: list[dict]) -> dict:
    """Per workload and figure, the median over runs (W3 moves 1.5x between runs of one server)."""
    import statistics

    return {w: {k: statistics.median(r[w][k] for r in runs) for k in runs[0][w]} for w in runs[0]}


def run(model: Path, log_dir: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix="llmserve-cache-"))
    rows = {}
    cluster, rows["fresh"] = _start(model, cache, log_dir / "fresh")
    try:
        first = _workloads(cluster)
        rows["fresh"].update(first=first, warm=_median_of([_workloads(cluster) for _ in range(WARM_RUNS)]))
        rows["fresh"]["compiled_while_serving"] = len(COMPILED_LATER.findall(cluster.logs(tail=None)))
    finally:
        cluster.stop()
    cluster, rows["restart"] = _start(model, cache, log_dir / "restart")
    try:
        rows["restart"].update(first=_workloads(cluster))
        rows["restart"]["compiled_while_serving"] = len(COMPILED_LATER.findall(cluster.logs(tail=None)))
    finally:
        cluster.stop()
    return rows


def report(rows: dict) -> None:
    warm = rows["fresh"]["warm"]
    for start, r in rows.items():
        print(f"FIRST {start}: serving after {r['start_s']:.1f} s (graph capture {r['capture_s']} s; Triton "
              f"compiled {r['compiled']}, {r['from_disk']} from disk; compiled while serving {r['compiled_while_serving']})")
        runs = [("first", r["first"])] + ([("warm", r["warm"])] if "warm" in r else [])
        for label, w in runs:
            print(f"FIRST {start} {label}: W1 {w['w1']['tpot_ms']:.3f} ms ({warm['w1']['tpot_ms'] / w['w1']['tpot_ms']:.2f}x "
                  f"warm speed), W2 {w['w2']['tok_s']:,.0f} tok/s ({w['w2']['tok_s'] / warm['w2']['tok_s']:.2f}x warm), "
                  f"W3 {w['w3']['tok_s']:,.0f} tok/s ({w['w3']['tok_s'] / warm['w3']['tok_s']:.2f}x warm), "
                  f"W3 TTFT {w['w3']['ttft_ms']:.0f} ms")


def main() -> None:
    from benchmarks.harness import model_path

    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path)
    p.add_argument("--model", type=Path)
    args = p.parse_args()
    model = args.model or model_path("llama-1b")
    rows = run(model, Path(tempfile.mkdtemp(prefix="llmserve-first-")))
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
