"""No compilation while serving: a runner built as start-up builds it (graphs, then the warm-up
of executor_svc/startup/warmup.py) runs a W3-like mix without compiling one Triton kernel
variant (counted by kernels/jit_cache.py). The mix's driver is checked on CPU too.

Run the CUDA test in a fresh process to make it strict (a variant another test compiled
earlier in the same process would not be counted here)."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.random_model import build_random_model
from tests.executor.conftest import make_runner
from tests.executor.w3_mix import MixScheduler, make_requests


def grammar() -> str:
    from llmserve.structured import regex, to_grammar

    return to_grammar(regex(r"[0-9]{2,6}", "test"))


def test_the_mix_runs_on_cpu(model_dirs):
    """The driver: every request finishes, steps of many decode batch sizes, chunked prompts."""
    runner = make_runner(model_dirs["tiny-llama"], max_num_seqs=16, max_num_batched_tokens=128,
                         num_kv_blocks=256, max_model_len=512)
    requests = make_requests(24, runner.info().vocab_size, max_len=200, grammar=grammar())
    sched = MixScheduler(runner, requests, arrivals=4)
    results = sched.run()
    assert all(len(r.out) == r.max_out for r in requests)
    assert len({b for b, _ in sched.decode_steps}) >= 5  # decode batches of many sizes
    assert any(r.prompt_logprobs for r in results) and any(r.logprobs for r in results)
    assert max(len(r.prompt) for r in requests) > 128  # chunked over steps


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [
    dict(),  # the executor's defaults for 64 rows and 2048 tokens: eager past 1024 tokens
    dict(cuda_graph_sizes=(1, 2, 4, 8), mixed_cuda_graph_sizes=(32,)),  # eager decodes past 32 rows
    dict(enforce_eager=True),  # every step eager
], ids=["default-graphs", "few-graphs", "eager"])
def test_a_w3_like_mix_compiles_nothing_after_start(tmp_path, graphs):
    from kernels.jit_cache import jit_counter
    from tests.executor.cuda_helpers import cuda_runner

    path = build_random_model(tmp_path / "tiny", "tiny-llama", dtype=torch.bfloat16)
    runner = cuda_runner(path, num_kv_blocks=4096, **graphs)  # graphs + warm-up, as start-up
    counter = jit_counter()
    assert counter is not None and counter.serving  # the warm-up ran and is over
    start = counter.compiled
    requests = make_requests(160, runner.info().vocab_size, max_len=1500, max_out=64, grammar=grammar())
    sched = MixScheduler(runner, requests, arrivals=40)
    results = sched.run()
    compiled = counter.compiled - start
    assert compiled == 0, f"{compiled} Triton variants compiled while serving: {counter.names[-compiled:]}"
    eager = sum(r.graph_size == 0 for r in results)  # the mix reached what it is meant to
    assert eager and (eager == len(results)) == bool(graphs.get("enforce_eager"))
    assert len({b for b, _ in sched.decode_steps}) >= 10 and len(results) > 50
    if graphs:  # decode batches past the decode and mixed graphs ran eagerly
        assert len({b for b, g in sched.decode_steps if g == 0}) >= 3, sched.decode_steps

