"""W8: FP8 weights and the FP8 KV cache against bf16, same run (issue 13 part 4).

In-process (one runner at a time): KV blocks in the same memory and W4 decode steps for bf16,
`--quantization fp8` and `--kv-cache-dtype fp8` (the last at a 2,048-token context, where
the KV reads matter). Through both services: W1 and W2 with FP8 weights, W2 and the long-context
workload (64 x 3,072-token prompts, 512 outputs) with the FP8 KV cache, W1 and W2 with both, and
all three workloads in bf16 on a fresh cluster of the same section. Then the accuracy figures
(benchmarks/fp8_accuracy.py).
"""

from __future__ import annotations

import gc
from pathlib import Path

VARIANTS = {"bf16": {}, "fp8_weights": {"quantization": "fp8"}, "fp8_kv": {"kv_cache_dtype": "fp8"}}


def run(out: dict, log_dir: Path) -> None:
    import torch

    from benchmarks import decode_step, fp8_accuracy, workloads
    from benchmarks.harness import _full_system_run, model_path, runner_for

    model = model_path("llama-1b")
    for name, overrides in VARIANTS.items():
        runner, _ = runner_for("llama-1b", **overrides)
        context = 2048 if name == "fp8_kv" else 512
        out[f"inproc_{name}"] = dict(num_blocks=runner.info().num_blocks, w4=[
            decode_step.measure(runner, b, context=context) for b in ((1, 64, 256) if context == 512 else (1, 64))])
        if name == "bf16":
            out["inproc_bf16"]["w4_ctx2048"] = [decode_step.measure(runner, b, context=2048) for b in (1, 64)]
        del runner
        gc.collect()
        torch.cuda.empty_cache()
    w1, w2, long = (workloads.w1(), 0.0), (workloads.w2(), 0.6), (workloads.long_context(), 0.0)
    out["fp8_weights"] = _full_system_run(model, log_dir / "fp8w", [], {"w1": w1, "w2": w2},
                                          ("--quantization", "fp8"))
    out["fp8_kv"] = _full_system_run(model, log_dir / "fp8kv", [], {"w2": w2, "long": long},
                                     ("--kv-cache-dtype", "fp8"))
    out["bf16"] = _full_system_run(model, log_dir / "bf16", [], {"w1": w1, "w2": w2, "long": long})
    out["fp8_both"] = _full_system_run(model, log_dir / "fp8both", [], {"w1": w1, "w2": w2},
                                       ("--quantization", "fp8", "--kv-cache-dtype", "fp8"))
    out["accuracy"] = {shape: fp8_accuracy.measure(model_path(shape)) for shape in ("llama-1b", "qwen3-0.6b")}


def rows(w8: dict, full: dict) -> list[tuple[str, str, str]]:
    """Report rows (benchmarks/report.py): the FP8 figures beside bf16's of the same run."""
    r = []
    blocks = {k: w8.get(f"inproc_{k}", {}).get("num_blocks") for k in VARIANTS}
    if blocks["bf16"] and blocks["fp8_kv"]:
        r.append(("W8 KV blocks, fp8 cache vs bf16", f"{blocks['fp8_kv'] / blocks['bf16']:.2f}x",
                  f"{blocks['fp8_kv']:,} vs {blocks['bf16']:,} blocks (fp8 weights: {blocks['fp8_weights']:,}); target 2.0x"))
    for name in ("bf16", "fp8_weights", "fp8_kv"):
        inproc = w8.get(f"inproc_{name}", {})
        for row in inproc.get("w4", []) + inproc.get("w4_ctx2048", []):
            r.append((f"W8 W4 {name} b={row['batch']} ctx={row['context']}",
                      f"graph {row['graph_step_ms']:.3f} ms (dev {row['graph_device_ms']:.3f})", ""))
    bf16 = w8.get("bf16") or full.get("overlap_on", {})
    for variant, label in (("fp8_weights", "fp8 weights"), ("fp8_kv", "fp8 KV"), ("fp8_both", "fp8 both")):
        for name, res in w8.get(variant, {}).items():
            base = bf16.get(name)
            figure = f"{res['tpot_ms']:.3f} ms TPOT" if name == "w1" else f"{res['tok_s']:,.0f} tok/s"
            cmp = ""
            if base:
                cmp = (f"bf16 {base['tpot_ms']:.3f} ms" if name == "w1"
                       else f"{res['tok_s'] / base['tok_s']:.2f}x bf16 {base['tok_s']:,.0f}")
            r.append((f"W8 {name.upper()} full system, {label}", figure, cmp))
    for shape, variants in w8.get("accuracy", {}).items():
        for variant, parts in variants.items():
            d, p = parts["decode"], parts["prefill"]
            r.append((f"W8 accuracy {shape}, {variant}", f"top-1 {d['top1']:.3f} / {p['top1']:.3f}",
                      f"decode / prefill; cosine {d['cosine_mean']:.4f} / {p['cosine_mean']:.4f}, "
                      f"KL {d['kl_mean']:.1e} / {p['kl_mean']:.1e}"))
    return r
