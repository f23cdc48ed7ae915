"""FP8 weight GEMMs (kernels/fp8_gemm.py) vs bf16 cuBLAS at llama-1b layer shapes, on CUDA.

    python -m benchmarks.fp8_bench [--rows-small 1 8 16 32 64] [--rows-large 64 256 1024 4096] [--tune]

Small M (w8a16 serves up to 64 rows): bf16 cuBLAS (F.linear), the w8a16 kernel (channel and
128x128 block scales) and the dequantize path (dequantize to bf16 + F.linear, the former
forward). Large M: bf16 cuBLAS vs w8a8 (dynamic per-token / per-group activation quantization
included): channel scales through torch._scaled_mm, through the Triton GEMM (its tuned config)
and "auto" (the faster of both, tuned per shape up to 512 rows), block scales through the Triton
block-scaled GEMM; "w8a8 chan prequant" is `_scaled_mm` on activations quantized already (what
the model runs after a fused norm / SiLU, kernels/fp8_fused.py), and layer "prologue" times
those kernels (rms_norm + residual at K 2048, silu_and_mul at I 8192) plain, fused with the
quantization, and plain + the separate quantization launch (the unfused w8a8 model's sequence). Each timing replays a CUDA
graph over weight copies spanning >= 256 MB (benchmarks/skinny_bench.py), so weights come from
HBM. The w8a16 kernel runs its default config unless --tune (tuning compiles every candidate:
minutes). Prints µs per call, GB/s of weight + activation bytes, then one JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
import torch.nn.functional as F

import kernels
from benchmarks.skinny_bench import L2_SPAN_BYTES, _graph_time_us

LAYERS = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}  # llama-1b
BLOCK = (128, 128)


def _fp8_weights(n: int, k: int, strategy: str, copies: int):
    """copies x (fp8 weight [N, K], float32 scales) with a real layer's magnitudes."""
    out = []
    for _ in range(copies):
        w = (torch.randn(n, k, device="cuda") * 120).clamp(-448, 448).to(torch.float8_e4m3fn)
        shape = (n,) if strategy == "channel" else (-(-n // BLOCK[0]), -(-k // BLOCK[1]))
        out.append((w, torch.rand(shape, device="cuda") * 2e-4 + 1e-4))
    return out


def _copies(nbytes: int) -> int:
    return max(2, min(512, -(-L2_SPAN_BYTES // nbytes)))


def _time(calls) -> float:
    t = _graph_time_us(calls)
    del calls
    torch.cuda.empty_cache()
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-small", nargs="+", type=int, default=[1, 8, 16, 32, 64])
    parser.add_argument("--rows-large", nargs="+", type=int, default=[64, 256, 1024, 4096])
    parser.add_argument("--tune", action="store_true", help="tune the w8a16 configs (slow) instead of defaults")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    from kernels.fp8_gemm import (
        dequantize_linear,
        w8a16_default_config,
        w8a16_linear_triton,
    )
    from kernels.fp8_w8a8 import quantize_activations_triton, w8a8_linear_triton

    start, dt, rows = time.time(), torch.bfloat16, []
    print(f"{torch.cuda.get_device_name()}, bf16 activations, fp8 e4m3 weights; llama-1b layers")
    print(f"{'layer':<8} {'N x K':>11} {'M':>5} {'path':<16} {'us':>9} {'GB/s':>6} {'vs bf16':>8}")

    def record(layer, n, k, m, path, us, weight_bytes, base_us):
        gbs = (weight_bytes + 2 * m * (n + k)) / us / 1e3
        rows.append({"layer": layer, "m": m, "path": path, "us": round(us, 2), "gbs": round(gbs)})
        print(f"{layer:<8} {f'{n}x{k}':>11} {m:>5} {path:<16} {us:>9.2f} {gbs:>6.0f} {base_us / us:>7.2f}x")

    for layer, (n, k) in LAYERS.items():
        dense = [torch.randn(n, k, device="cuda", dtype=dt) * 0.02 for _ in range(_copies(2 * n * k))]
        fp8 = {s: _fp8_weights(n, k, s, _copies(n * k)) for s in ("channel", "block")}
        for m in args.rows_small:
            x = torch.randn(m, k, device="cuda", dtype=dt)
            base = _time([partial(F.linear, x, w) for w in dense])
            record(layer, n, k, m, "bf16 cuBLAS", base, 2 * n * k, base)
            for strategy, weights in fp8.items():
                block = BLOCK if strategy == "block" else None
                cfg = None if args.tune else w8a16_default_config(m, n, k, strategy, block)
                us = _time([partial(w8a16_linear_triton, x, w, s, strategy, block, config=cfg)
                            for w, s in weights])
                record(layer, n, k, m, f"w8a16 {strategy}", us, n * k, base)
            us = _time([partial(dequantize_linear, x, w, s, "channel", None) for w, s in fp8["channel"]])
            record(layer, n, k, m, "dequantize", us, n * k, base)
        for m in args.rows_large:
            x = torch.randn(m, k, device="cuda", dtype=dt)
            base = _time([partial(F.linear, x, w) for w in dense])
            record(layer, n, k, m, "bf16 cuBLAS", base, 2 * n * k, base)
            for strategy, backend in (("channel", "scaled_mm"), ("channel", "triton"), ("channel", "auto"),
                                      ("block", "triton")):
                block = BLOCK if strategy == "block" else None
                us = _time([partial(w8a8_linear_triton, x, w, s, strategy, block, backend=backend)
                            for w, s in fp8[strategy]])
                record(layer, n, k, m, f"w8a8 {strategy[:5]} {backend[:6]}", us, n * k, base)
            act = kernels.rms_norm_quant(x, torch.ones(k, device="cuda", dtype=dt), 1e-6, None, k)
            us = _time([partial(w8a8_linear_triton, act, w, s, "channel") for w, s in fp8["channel"]])
            record(layer, n, k, m, "w8a8 chan prequant", us, n * k, base)
        del dense, fp8
        torch.cuda.empty_cache()
    for m in args.rows_large:  # the kernels before qkv / gate_up (norm) and down (SiLU)
        x, r = (torch.randn(m, 2048, device="cuda", dtype=dt) for _ in range(2))
        g, nw = torch.randn(m, 2 * 8192, device="cuda", dtype=dt), torch.ones(2048, device="cuda", dtype=dt)
        cases = {"rms_norm": lambda: kernels.rms_norm(x, nw, 1e-6, r),
                 "rms_norm_quant": lambda: kernels.rms_norm_quant(x, nw, 1e-6, r, 2048),
                 "rms_norm + quant": lambda: quantize_activations_triton(kernels.rms_norm(x, nw, 1e-6, r)[0], 2048),
                 "silu_and_mul": lambda: kernels.silu_and_mul(g),
                 "silu_and_mul_quant": lambda: kernels.silu_and_mul_quant(g, 8192),
                 "silu_and_mul + quant": lambda: quantize_activations_triton(kernels.silu_and_mul(g), 8192)}
        for path, fn in cases.items():
            us = _time([fn] * 16)
            base = us if path in ("rms_norm", "silu_and_mul") else base
            record("prologue", 2048, 2048 if "norm" in path else 8192, m, path, us, 0, base)
    sums: dict[str, dict[str, float]] = {}
    for r in rows:
        sums.setdefault(str(r["m"]), {}).setdefault(r["path"], 0.0)
        sums[str(r["m"])][r["path"]] = round(sums[str(r["m"])][r["path"]] + r["us"], 2)
    print(json.dumps({"bench": "fp8_gemm", "device": torch.cuda.get_device_name(), "tuned": args.tune,
                      "layer_sum_us": sums, "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
