"""Quick kernel micro-benchmark on a CUDA GPU (not a test): decode attention at llama-1b shapes.

    python -m tests.kernels.bench_kernels

Prints, per batch size at context 512 (32 query heads, 8 KV heads, head_dim 64, block 16, bf16),
the median time of the Triton decode kernel eager and inside a CUDA graph, the KV bytes it must
read, the bandwidth that implies, and the static-shape torch fallback for comparison.
"""

from __future__ import annotations

import torch
import triton.testing

import kernels
from tests.kernels.kernel_cases import make_case


def bench_decode(batch: int, context: int = 512, max_blocks: int = 256) -> None:
    case = make_case([1] * batch, [context] * batch, 32, 8, 64, 16, torch.bfloat16, "cuda", seed=batch,
                     extra_columns=max_blocks - context // 16)  # a table as wide as the executor's
    case.k_cache.nan_to_num_(0.0), case.v_cache.nan_to_num_(0.0)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    fn = lambda: kernels.paged_decode_attention(*args)  # noqa: E731
    eager_ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
    graph_ms = triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
    kv_bytes = 2 * batch * context * 8 * 64 * 2
    line = (f"decode batch {batch:3d} ctx {context}: eager {eager_ms * 1e3:7.1f} us, graph {graph_ms * 1e3:7.1f} us, "
            f"KV {kv_bytes / 1e6:6.1f} MB -> {kv_bytes / graph_ms / 1e9:5.2f} TB/s")
    try:
        from executor_svc.models.layers import paged_decode_attention_torch
        torch_ms = triton.testing.do_bench_cudagraph(lambda: paged_decode_attention_torch(*args), rep=100,
                                                     return_mode="median")
        line += f"; torch fallback graph {torch_ms * 1e3:7.1f} us ({torch_ms / graph_ms:.1f}x)"
    except Exception as e:  # the fallback lives in another package; its absence is no failure here
        line += f"; torch fallback n/a ({type(e).__name__})"
    print(line, flush=True)


def bench_prefill(num_seqs: int, q_len: int, prefix: int = 0) -> None:
    """Varlen kernel: num_seqs requests of q_len new tokens over a cached prefix of prefix tokens."""
    seq_len = prefix + q_len
    case = make_case([q_len] * num_seqs, [seq_len] * num_seqs, 32, 8, 64, 16, torch.bfloat16, "cuda")
    case.k_cache.nan_to_num_(0.0), case.v_cache.nan_to_num_(0.0)
    ms = triton.testing.do_bench(lambda: kernels.paged_attention(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.query_start_loc,
        case.scale, case.max_query_len, case.max_seq_len), warmup=20, rep=100, return_mode="median")
    # causal FLOPs: 4 * D * heads * (sum over new tokens of the positions each sees)
    visible = num_seqs * (q_len * prefix + q_len * (q_len + 1) / 2)
    flops = 4 * 64 * 32 * visible
    print(f"prefill {num_seqs} x {q_len} new over {prefix} cached: {ms * 1e3:8.1f} us, "
          f"{flops / ms / 1e9:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    for b in (1, 8, 32, 64, 256):
        bench_decode(b)
    bench_prefill(1, 2048)
    bench_prefill(8, 1024)
    bench_prefill(4, 512, prefix=2048)
