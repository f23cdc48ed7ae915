"""Skinny GEMMs (kernels/skinny_gemm.py) vs cuBLAS at decode row counts, on CUDA.

    python -m benchmarks.skinny_bench [--models llama-1b smollm2-135m] [--rows 1 2 4 8 16]

For each linear layer of a decode step: cuBLAS (torch.nn.functional.linear, after the separate
rms_norm / silu_and_mul launch where the skinny path fuses one) against the skinny kernel. Each
timing replays a CUDA graph that runs the op over enough copies of the weight to exceed the L2
cache (>= 256 MB in all), so every call reads its weight from HBM as a decode step does, and
launch gaps are those of a graph. Prints µs per call and GB/s of weight + activation bytes.

    python -m benchmarks.skinny_bench --chain [--layers 16]

The decode step's chain instead: per model, `--layers` layers of the four skinny launches of a
decode layer at one row (norm + qkv, o, norm + gate_up, silu + down; each one's output the next
one's input, as in the model, attention left out) and the lm_head, in one CUDA graph, plainly
launched and as programmatic dependent launches (pdl): µs per layer and the weights' GB/s.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

import kernels

# name -> {layer: (N, K)}; hidden, intermediate, qkv from the model configs
MODELS = {
    "llama-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                 "lm_head": (128256, 2048)},
    "smollm2-135m": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                     "lm_head": (49152, 576)},
}
L2_SPAN_BYTES = 256 << 20
EPS = 1e-5


def _graph_time_us(calls: list[Callable[[], object]], reps: int = 10) -> float:
    """Mean µs per call of a CUDA graph that makes every call once, replayed reps times."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up: tuning, compilation, cuBLAS handles, off the capture
            call()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(calls))


def _ops(layer: str, m: int, n: int, k: int, dtype: torch.dtype, copies: int):
    """(cuBLAS calls, skinny calls, bytes per call) over `copies` weights of [N, K]."""
    dev = "cuda"
    weights = [torch.randn(n, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=dtype)
    residual, norm_w = torch.randn_like(x), torch.ones(k, device=dev, dtype=dtype)
    gate_up = torch.randn(m, 2 * k, device=dev, dtype=dtype)
    if layer in ("qkv", "gate_up"):  # the RMSNorm (with residual add) fused as prologue
        base = [lambda w=w: F.linear(kernels.rms_norm(x, norm_w, EPS, residual)[0], w) for w in weights]
        skinny = [lambda w=w: kernels.rms_norm_linear(x, residual, norm_w, EPS, w) for w in weights]
        act_bytes = 3 * m * k
    elif layer == "down":  # silu_and_mul fused as prologue
        base = [lambda w=w: F.linear(kernels.silu_and_mul(gate_up), w) for w in weights]
        skinny = [lambda w=w: kernels.silu_mul_linear(gate_up, w) for w in weights]
        act_bytes = 2 * m * k
    else:
        base = [lambda w=w: F.linear(x, w) for w in weights]
        skinny = [lambda w=w: kernels.skinny_linear(x, w) for w in weights]
        act_bytes = m * k
    return base, skinny, (n * k + act_bytes + m * n) * weights[0].element_size()


def chain(model: str, num_layers: int, dtype: torch.dtype, pdl: bool) -> tuple[float, int]:
    """(µs of one pass of the chain, weight bytes it reads) at one row."""
    shapes, dev = MODELS[model], "cuda"
    hidden = shapes["o"][1]
    (nq, _), (ngu, _), (_, inter) = shapes["qkv"], shapes["gate_up"], shapes["down"]

    def weight(n, k):
        return torch.randn(n, k, device=dev, dtype=dtype) * 0.02

    layers = [(weight(nq, hidden), weight(hidden, hidden), weight(ngu, hidden), weight(hidden, inter),
               torch.ones(hidden, device=dev, dtype=dtype)) for _ in range(num_layers)]
    head = weight(*shapes["lm_head"])
    x, residual = torch.randn(1, hidden, device=dev, dtype=dtype), torch.randn(1, hidden, device=dev, dtype=dtype)

    def one_pass():
        h, res = x, residual
        for qkv, o, gate_up, down, norm in layers:
            y, res = kernels.rms_norm_linear(h, res, norm, EPS, qkv, pdl=pdl)
            a = kernels.skinny_linear(y[:, :hidden], o, pdl=pdl)
            gu, res = kernels.rms_norm_linear(a, res, norm, EPS, gate_up, pdl=pdl)
            h = kernels.silu_mul_linear(gu, down, pdl=pdl)
        return kernels.skinny_linear(h, head, pdl=pdl)

    nbytes = sum(t.numel() * t.element_size() for layer in layers for t in layer[:4]) + head.numel() * head.element_size()
    return _graph_time_us([one_pass]), nbytes


def main_head(args, dtype: torch.dtype) -> None:
    """The step's tail at decode rows: final norm, lm_head, Gumbel-max sampling (half the rows
    greedy), unfused (kernels.rms_norm, skinny_linear, gumbel_sample: 4 launches) vs one pass
    (kernels.rms_norm_lm_head_sample: 2 launches), in CUDA graphs over weight copies past the L2."""
    print(f"{torch.cuda.get_device_name()}, {args.dtype}; final norm + lm_head + sampling, µs a call")
    for model in args.models:
        vocab, hidden = MODELS[model]["lm_head"]
        copies = max(2, -(-L2_SPAN_BYTES // (vocab * hidden * 2)))
        heads = [torch.randn(vocab, hidden, device="cuda", dtype=dtype) * 0.02 for _ in range(copies)]
        norm = torch.ones(hidden, device="cuda", dtype=dtype)
        for m in args.rows:
            x, res = (torch.randn(m, hidden, device="cuda", dtype=dtype) for _ in range(2))
            temp = torch.where(torch.arange(m, device="cuda") % 2 == 0, 0.0, 0.8).float()
            seeds, pos = torch.arange(m, device="cuda") + 7, torch.arange(m, device="cuda") + 100
            for pdl in (False, True):
                unfused = [lambda w=w: kernels.gumbel_sample(
                    kernels.skinny_linear(kernels.rms_norm(x, norm, EPS, res)[0], w, pdl=pdl), temp, seeds, pos)
                    for w in heads]
                fused = [lambda w=w: kernels.rms_norm_lm_head_sample(x, res, norm, EPS, w, temp, seeds, pos, pdl=pdl)
                         for w in heads]
                t_u, t_f = _graph_time_us(unfused), _graph_time_us(fused)
                print(f"HEAD {model:<13} M={m:<2} pdl={'on ' if pdl else 'off'} unfused {t_u:8.2f}  one pass {t_f:8.2f}  "
                      f"({t_u / t_f:.2f}x)")
        del heads
        torch.cuda.empty_cache()


def main_chain(args, dtype: torch.dtype) -> None:
    print(f"{torch.cuda.get_device_name()}, {args.dtype}; {args.layers} decode layers (4 skinny launches each) + lm_head, "
          "one row, one CUDA graph")
    for model in args.models:
        for rep in range(2):  # alternating, twice
            for pdl in (False, True):
                us, nbytes = chain(model, args.layers, dtype, pdl)
                print(f"{model:<13} pdl={'on ' if pdl else 'off'} round {rep}: {us:>8.1f} us a pass, "
                      f"{us / args.layers:>6.2f} us a layer (head included), {nbytes / us / 1e3:>6.0f} GB/s of weights")
                torch.cuda.empty_cache()


def _config_name(cfg) -> str:
    """A tuned config, short: n<block_n>k<block_k>w<warps>s<stages>x<split>[dot|cc]."""
    return (f"n{cfg.block_n}k{cfg.block_k}w{cfg.num_warps}s{cfg.num_stages}x{cfg.split_k}"
            f"{'dot' if cfg.dot else 'cc'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--chain", action="store_true", help="the decode layer chain, plain vs pdl")
    parser.add_argument("--head", action="store_true", help="final norm + lm_head + sampling, unfused vs one pass")
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    dtype = getattr(torch, args.dtype)
    if args.chain:
        return main_chain(args, dtype)
    if args.head:
        return main_head(args, dtype)
    from kernels.skinny_tune import _tuned

    print(f"{torch.cuda.get_device_name()}, {args.dtype}; cuBLAS = F.linear (+ separate norm / silu launch)")
    print(f"{'model':<13} {'layer':<8} {'N x K':>13} {'M':>3} {'cuBLAS us':>10} {'GB/s':>6} "
          f"{'skinny us':>10} {'GB/s':>6} {'speed-up':>8}")
    for model in args.models:
        totals = {m: [0.0, 0.0] for m in args.rows}
        for layer, (n, k) in MODELS[model].items():
            copies = max(2, min(512, -(-L2_SPAN_BYTES // (n * k * torch.finfo(dtype).bits // 8))))
            for m in args.rows:
                base, skinny, nbytes = _ops(layer, m, n, k, dtype, copies)
                known = set(_tuned)
                t_base, t_skinny = _graph_time_us(base), _graph_time_us(skinny)
                chosen = [cfg for key, cfg in _tuned.items() if key not in known]
                totals[m][0] += t_base
                totals[m][1] += t_skinny
                print(f"{model:<13} {layer:<8} {f'{n}x{k}':>13} {m:>3} {t_base:>10.2f} {nbytes / t_base / 1e3:>6.0f} "
                      f"{t_skinny:>10.2f} {nbytes / t_skinny / 1e3:>6.0f} {t_base / t_skinny:>7.2f}x  "
                      f"{' '.join(_config_name(c) for c in chosen)}")
                del base, skinny
                torch.cuda.empty_cache()
        for m, (t_base, t_skinny) in totals.items():
            print(f"{model:<13} {'sum':<8} {'(one layer+head)':>13} {m:>3} {t_base:>10.2f} {'':>6} {t_skinny:>10.2f} "
                  f"{'':>6} {t_base / t_skinny:>7.2f}x")


if __name__ == "__main__":
    main()
