"""W4 for A-B runs: one decode step's device time in this tree, per model shape and batch, against
the floor at this GPU's measured copy bandwidth (lent machines differ: H100 or H200).

    python -m benchmarks.w4_ab [--shapes llama-1b,smollm2-135m-draft] [--batches 1,8,64,256] [--no-pdl]
                               [--skinny-max-tokens N]
                               [--persistent-decode] [--quantization fp8] [--kv-cache-dtype fp8]

Prints one line a (shape, batch): `W4 <shape> b=<b> device <ms> step <ms> floor <ms> (<x> floor)`,
graph-replayed steps, medians of benchmarks.decode_step.measure. Run it in each tree, alternating.
"""

from __future__ import annotations

import argparse
import gc

import torch

from benchmarks.decode_step import measure


def copy_bandwidth() -> float:
    """Bytes a second of a 1 GiB device-to-device copy (read + write), the best of 5."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.numel() * src.element_size() / best


def main() -> None:
    from benchmarks.harness import runner_for

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="llama-1b,smollm2-135m-draft")
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--no-pdl", action="store_true")
    p.add_argument("--skinny-max-tokens", type=int, default=None, help="the executor's flag (default: its own)")
    p.add_argument("--persistent-decode", action="store_true", help="the executor's flag")
    p.add_argument("--quantization", default="", help="the executor's flag (fp8: per-channel FP8 weights)")
    p.add_argument("--kv-cache-dtype", default="auto", help="the executor's flag")
    p.add_argument("--label", default="")
    args = p.parse_args()
    bandwidth = copy_bandwidth()
    print(f"W4 {args.label} copy bandwidth {bandwidth / 1e12:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    for shape in args.shapes.split(","):
        batches = [int(x) for x in args.batches.split(",")]
        # only the measured sizes' graphs (a fresh machine compiles less); prefill runs eager
        overrides = dict(cuda_graph_sizes=tuple(batches), mixed_cuda_graph_sizes=())
        if args.no_pdl:
            overrides["pdl"] = False
        if args.persistent_decode:
            overrides["persistent_decode"] = True
        if args.quantization:
            overrides["quantization"] = args.quantization
        if args.kv_cache_dtype != "auto":
            overrides["kv_cache_dtype"] = args.kv_cache_dtype
        if args.skinny_max_tokens is not None:
            overrides["skinny_max_tokens"] = args.skinny_max_tokens
        runner = runner_for(shape, **overrides)[0]
        for b in batches:
            r = measure(runner, b, bytes_per_s=bandwidth)
            floor = r["floor_ms"]
            print(f"W4 {args.label} {shape} b={b} device {r['graph_device_ms']:.3f} step {r['graph_step_ms']:.3f} "
                  f"floor {floor:.3f} ({r['graph_device_ms'] / floor:.2f}x floor)", flush=True)
        del runner
        gc.collect()  # the next shape's KV-cache budget counts what this one still holds (cycles)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
