"""Helpers of the CUDA executor tests (test_cuda_runner.py): runners, a small plan driver, checks."""

from __future__ import annotations

import torch

from executor_svc.config import ExecutorConfig, default_mixed_cuda_graph_sizes
from executor_svc.startup.build import build_runner
from executor_svc.worker.model_runner import ModelRunner
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import decode_rows


def cuda_runner(path, **kw) -> ModelRunner:
    """A CUDA runner built from an ExecutorConfig (whose field defaults are not from_args'
    defaults: the graph sizes are given here, mixed ones as the executor's default). Its KV cache
    is fixed (what Driver gives 64 requests, and the null block), not measured from free memory:
    tests run in parallel on one GPU (num_kv_blocks=0 measures; see memory_share)."""
    base = dict(model=str(path), device="cuda", dtype="bfloat16", max_num_seqs=64,
                max_num_batched_tokens=2048, cuda_graph_sizes=(1, 2, 4, 8, 16, 32, 64),
                mixed_cuda_graph_sizes=default_mixed_cuda_graph_sizes(2048), num_kv_blocks=64 * 16 + 1)
    return build_runner(ExecutorConfig(**{**base, **kw}))


def memory_share(nbytes: int) -> float:
    """The --gpu-memory-utilization that leaves a runner built next nbytes of the memory free now
    (its weights, activation peak and measured KV cache), whatever other processes hold."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return 1.0 - max(free - nbytes, 0) / total


class Driver:
    """Prefills num_reqs prompts of prompt_len tokens, then decodes them together."""

    def __init__(self, runner: ModelRunner, num_reqs: int, prompt_len: int = 40, max_len: int = 256):
        self.runner, self.step_id, self.req_ids = runner, 0, list(range(1, num_reqs + 1))
        info = runner.info()
        blocks_per = -(-max_len // info.block_size)
        runner.reset()
        gen = torch.Generator().manual_seed(num_reqs)
        news = [NewRequestData(r, torch.randint(2, info.vocab_size, (prompt_len,), generator=gen).tolist(),
                               SamplerParams(), list(range(1 + i * blocks_per, 1 + (i + 1) * blocks_per)), 0,
                               prompt_len)
                for i, r in enumerate(self.req_ids)]
        per_step = max(1, info.max_num_batched_tokens // prompt_len)
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
            out = self.execute(StepPlan(0, [], decode_rows(self.req_ids)))
            sizes.append(out.graph_size)
            for r, t in out.sampled().items():
                self.tokens[r].append(t)
        return sizes


def check_graph_tokens_equal_eager(runner: ModelRunner, num_reqs: int, num_steps: int = 6) -> int:
    """Greedy tokens with graphs == without; returns the graph size used."""
    with_graph = Driver(runner, num_reqs)
    sizes = with_graph.decode(num_steps)
    runner.use_graphs(False)
    try:
        eager = Driver(runner, num_reqs)
        eager.decode(num_steps)
    finally:
        runner.use_graphs(True)
    assert with_graph.tokens == eager.tokens, (num_reqs, with_graph.tokens, eager.tokens)
    assert len(set(sizes)) == 1 and sizes[0] >= num_reqs
    return sizes[0]


def decode_logits_graph_and_eager(runner: ModelRunner, num_reqs: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One decode step computed through its graph and eagerly on the same inputs -> [N, V] twice."""
    d = Driver(runner, num_reqs)
    graph_logits, eager_logits, shape = graph_and_eager_logits(runner, StepPlan(99, [], decode_rows(d.req_ids)))
    return graph_logits, eager_logits, shape.num_reqs


def graph_and_eager_logits(runner: ModelRunner, plan: StepPlan):
    """The plan's step through its graph, then eagerly on the same inputs -> ([N, V], [N, V],
    the graph's shape)."""
    with torch.inference_mode():
        step = runner._prepare(runner._apply(plan, []), 0).step
        shape = runner.graphs.shape_for(step)
        graph_logits = runner._forward(step, runner._copy_inputs(step, shape), shape)[0].clone()
        eager_logits = runner._forward(step, runner._copy_inputs(step, None), None)[0]
    return graph_logits, eager_logits, shape


def launch_without_sync(runner: ModelRunner, plan: StepPlan):
    """runner.launch(plan) with CUDA sync debugging set to "error": any host sync raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        return runner.launch(plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def mixed_scenario(runner: ModelRunner) -> tuple[dict[int, list[int]], list[int]]:
    """Greedy tokens and graph sizes of: a 20-token chunk of a 50-token prompt; its last 30
    beside a new 25-token prompt; both decoding beside a new 40-token prompt; decode; an
    80-token prompt beside three decode rows; decode."""
    from tests.executor.conftest import cached_rows

    runner.reset()
    gen = torch.Generator().manual_seed(5)
    prompts = {r: torch.randint(2, runner.info().vocab_size, (n,), generator=gen).tolist()
               for r, n in ((1, 50), (2, 25), (3, 40), (4, 80))}
    blocks = {r: list(range(1 + 16 * r, 17 + 16 * r)) for r in prompts}
    greedy = SamplerParams()
    tokens, sizes = {r: [] for r in prompts}, []
    plans = [
        StepPlan(1, [NewRequestData(1, prompts[1], greedy, blocks[1], 0, 20)]),
        StepPlan(2, [NewRequestData(2, prompts[2], greedy, blocks[2], 0, 25)], cached_rows((1, 30))),
        StepPlan(3, [NewRequestData(3, prompts[3], greedy, blocks[3], 0, 40)], cached_rows((1, 1), (2, 1))),
        StepPlan(4, [], decode_rows([1, 2, 3])),
        StepPlan(5, [], decode_rows([1, 2, 3])),
        StepPlan(6, [NewRequestData(4, prompts[4], greedy, blocks[4], 0, 80)], decode_rows([1, 2, 3])),
        StepPlan(7, [], decode_rows([1, 2, 3, 4])),
    ]
    for plan in plans:
        out = runner.execute(plan)
        sizes.append(out.graph_size)
        for r, t in out.sampled().items():
            tokens[r].append(t)
    return tokens, sizes


def mixed_logits_graph_and_eager(runner: ModelRunner, num_decode: int, chunk: int
                                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One mixed step (num_decode decode rows beside a new chunk-token prompt) through its
    graph and eagerly on the same inputs -> [num_decode + 1, V] twice, and the graph's size."""
    d = Driver(runner, num_decode)
    info = runner.info()
    blocks_per = -(-256 // info.block_size)  # what Driver gave each of its requests
    first = 1 + num_decode * blocks_per
    blocks_per = -(-(chunk + 16) // info.block_size)
    prompt = torch.randint(2, info.vocab_size, (chunk,), generator=torch.Generator().manual_seed(1)).tolist()
    new = NewRequestData(999, prompt, SamplerParams(), list(range(first, first + blocks_per)), 0, chunk)
    graph_logits, eager_logits, shape = graph_and_eager_logits(runner, StepPlan(99, [new], decode_rows(d.req_ids)))
    return graph_logits, eager_logits, shape.num_tokens
