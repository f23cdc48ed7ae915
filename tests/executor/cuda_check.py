"""CUDA checks of the executor (run: python -m tests.executor.cuda_check [--torch-fallbacks]).

Loads a tiny and a llama-1b-shaped random model on the GPU, checks that graph replay equals
eager execution, and times a decode step eagerly and through a graph at batch 1 and 64.
test_cuda_runner.py runs the same checks under pytest.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from executor_svc import layers
from executor_svc.config import ExecutorConfig
from executor_svc.model_runner import ModelRunner
from executor_svc.plan import CachedRequest, NewRequest, SamplingParams, StepPlan
from executor_svc.random_model import build_random_model
from kernels import reference as ref


def use_torch_fallbacks() -> None:
    """Runs the model on the torch references / capturable torch fallbacks instead of Triton."""
    layers.write_kv = layers.write_kv_fallback
    layers.paged_decode_attention = layers.paged_decode_attention_fallback
    layers.paged_attention = layers._paged_attention_ref
    layers.rms_norm, layers.silu_and_mul = ref.rms_norm_reference, ref.silu_and_mul_reference
    layers.rotary_embedding = ref.rotary_embedding_reference


def cuda_runner(path, **kw) -> ModelRunner:
    base = dict(model=str(path), device="cuda", dtype="bfloat16", max_num_seqs=64,
                max_num_batched_tokens=2048, cuda_graph_sizes=(1, 2, 4, 8, 16, 32, 64))
    return ModelRunner(ExecutorConfig(**{**base, **kw}))


class Driver:
    """Prefills num_reqs prompts of prompt_len tokens, then decodes them together."""

    def __init__(self, runner: ModelRunner, num_reqs: int, prompt_len: int = 40, max_len: int = 256):
        self.runner, self.step_id, self.req_ids = runner, 0, list(range(1, num_reqs + 1))
        blocks_per = -(-max_len // runner.block_size)
        runner.reset()
        gen = torch.Generator().manual_seed(num_reqs)
        news = [NewRequest(r, torch.randint(2, runner.args.vocab_size, (prompt_len,), generator=gen).tolist(),
                           SamplingParams(), list(range(1 + i * blocks_per, 1 + (i + 1) * blocks_per)), 0, prompt_len)
                for i, r in enumerate(self.req_ids)]
        per_step = max(1, runner.config.max_num_batched_tokens // prompt_len)
        self.tokens = {}
        for i in range(0, num_reqs, per_step):  # prefill within the token budget
            self.tokens.update({r: [t] for r, t in self.execute(StepPlan(0, news[i:i + per_step])).sampled().items()})

    def execute(self, plan: StepPlan):
        self.step_id += 1
        plan.step_id = self.step_id
        return self.runner.execute(plan)

    def decode(self, num_steps: int) -> list[int]:
        """Runs decode steps; returns the graph size of each."""
        sizes = []
        for _ in range(num_steps):
            out = self.execute(StepPlan(0, [], [CachedRequest(r, [], 1) for r in self.req_ids]))
            sizes.append(out.graph_size)
            for r, t in out.sampled().items():
                self.tokens[r].append(t)
        return sizes


def check_graph_tokens_equal_eager(runner: ModelRunner, num_reqs: int, num_steps: int = 6) -> int:
    """Greedy tokens with graphs == without; returns the graph size used."""
    graphs = runner.graphs
    with_graph = Driver(runner, num_reqs)
    sizes = with_graph.decode(num_steps)
    runner.graphs = None
    try:
        eager = Driver(runner, num_reqs)
        eager.decode(num_steps)
    finally:
        runner.graphs = graphs
    assert with_graph.tokens == eager.tokens, (num_reqs, with_graph.tokens, eager.tokens)
    assert len(set(sizes)) == 1 and sizes[0] >= num_reqs
    return sizes[0]


def decode_logits_graph_and_eager(runner: ModelRunner, num_reqs: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One decode step computed through its graph and eagerly on the same inputs -> [N, V] twice."""
    d = Driver(runner, num_reqs)
    plan = StepPlan(99, [], [CachedRequest(r, [], 1) for r in d.req_ids])
    with torch.inference_mode():
        step = runner._prepare(runner._update_states(plan))
        size = runner.graphs.size_for(step)
        graph_logits = runner._forward(step, runner._copy_inputs(step, size), size).clone()
        eager_logits = runner._forward(step, runner._copy_inputs(step, 0), 0)
    return graph_logits, eager_logits, size


def launch_without_sync(runner: ModelRunner, plan: StepPlan):
    """runner.launch(plan) with CUDA sync debugging set to "error": any host sync raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        return runner.launch(plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def time_decode_pipelined(runner: ModelRunner, num_reqs: int, graphs: bool, num_steps: int = 30) -> float:
    """Mean wall time (µs) per decode step with two steps outstanding (launch N+1, finish N)."""
    saved = runner.graphs
    runner.graphs = saved if graphs else None
    try:
        d = Driver(runner, num_reqs, prompt_len=128, max_len=256)
        d.decode(5)  # warm-up
        plans = [StepPlan(1000 + i, [], [CachedRequest(r, [], 1) for r in d.req_ids]) for i in range(num_steps)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pending = runner.launch(plans[0])
        for plan in plans[1:]:
            nxt = runner.launch(plan)
            runner.finish(pending)
            pending = nxt
        runner.finish(pending)
        return (time.perf_counter() - t0) * 1e6 / num_steps
    finally:
        runner.graphs = saved


def time_decode(runner: ModelRunner, num_reqs: int, graphs: bool, num_steps: int = 30) -> float:
    """Median wall time (µs) of one decode step through execute()."""
    saved = runner.graphs
    runner.graphs = saved if graphs else None
    try:
        d = Driver(runner, num_reqs, prompt_len=128, max_len=256)
        d.decode(5)  # warm-up
        times = []
        for _ in range(num_steps):
            t0 = time.perf_counter()
            d.decode(1)
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    finally:
        runner.graphs = saved


def main(argv: list[str]) -> None:
    import logging

    logging.basicConfig(level=logging.INFO)
    if "--torch-fallbacks" in argv:
        use_torch_fallbacks()
    tmp = Path(tempfile.mkdtemp())
    tiny = cuda_runner(build_random_model(tmp / "tiny", "tiny-llama"), dtype="float32",
                       cuda_graph_sizes=(1, 2, 4, 8), num_kv_blocks=512)
    for n in (1, 3, 8):
        print(f"tiny fp32: {n} rows -> graph {check_graph_tokens_equal_eager(tiny, n)}, tokens equal eager")
    del tiny
    t0 = time.perf_counter()
    path = build_random_model(tmp / "1b", "llama-1b", dtype=torch.bfloat16, device="cuda")
    print(f"built llama-1b in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    runner = cuda_runner(path)
    print(f"llama-1b runner ready in {time.perf_counter() - t0:.1f} s: {runner.num_blocks} KV blocks, "
          f"graphs {runner.graphs.sizes}")
    for n in (1, 3, 64):
        g, e, size = decode_logits_graph_and_eager(runner, n)
        rel = ((g - e).abs().max() / e.abs().max()).item()
        agree = (g.argmax(-1) == e.argmax(-1)).float().mean().item()
        print(f"llama-1b bf16 decode {n} rows (graph {size}): max rel diff {rel:.2e}, argmax agree {agree:.2f}")
    for n in (1, 64):
        eager_us, graph_us = time_decode(runner, n, False), time_decode(runner, n, True)
        print(f"llama-1b decode step batch {n}: eager {eager_us:.0f} us, graph {graph_us:.0f} us")
        eager_us, graph_us = time_decode_pipelined(runner, n, False), time_decode_pipelined(runner, n, True)
        print(f"llama-1b decode step batch {n}, pipelined (2 outstanding): eager {eager_us:.0f} us, "
              f"graph {graph_us:.0f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
