"""Programmatic dependent launches (pdl=True; CUDA, compute capability 9.0+) of the decode
layer's kernels: the skinny GEMMs (kernels/skinny_gemm.py), rotary + KV write, decode attention
and its split reduce. The same bits as plain launches for every skinny variant and a split-K
config, for rotary and attention (split and not), eagerly and in a CUDA graph chaining a decode
layer's four GEMM launches and the lm_head (each launch reading the one before it: a kernel
that read its input before its wait would differ); a runner with it decodes the same tokens;
and the executor's --pdl switch."""

from __future__ import annotations

import pytest
import torch

import kernels
from executor_svc.config import ExecutorConfig

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="needs CUDA, compute capability 9.0+")
EPS = 1e-5


def _w(n, k, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16).cuda()


def _chain(x, residual, layers, head, pdl: bool):
    h, res = x, residual
    for qkv, o, gate_up, down, norm in layers:
        y, res = kernels.rms_norm_linear(h, res, norm, EPS, qkv, pdl=pdl)
        a = kernels.skinny_linear(y[:, :o.shape[1]], o, pdl=pdl)
        gu, res = kernels.rms_norm_linear(a, res, norm, EPS, gate_up, pdl=pdl)
        h = kernels.silu_mul_linear(gu, down, pdl=pdl)
    return kernels.skinny_linear(h, head, pdl=pdl), res


@pytest.mark.cuda
@needs_hopper
@pytest.mark.parametrize("m", [1, 3])
def test_pdl_launches_give_the_plain_launches_bits(m):
    from kernels.skinny_gemm import SkinnyConfig, rms_norm_linear_triton, silu_mul_linear_triton, skinny_linear_triton

    x, r, w, w_down = _w(m, 576, 1), _w(m, 576, 2), _w(1000, 576, 3), _w(1000, 576, 4)
    norm, gate_up = _w(1, 576, 5)[0].add_(1.0), _w(m, 1152, 6)
    for cfg in (None, SkinnyConfig(32, 128, 4, 4, 4)):  # the tuned one, a split-K one
        for pdl_args in ({}, {"pdl": True}):
            got = (skinny_linear_triton(x, w, config=cfg, **pdl_args),
                   *rms_norm_linear_triton(x, r, norm, EPS, w, config=cfg, **pdl_args),
                   silu_mul_linear_triton(gate_up, w_down, config=cfg, **pdl_args))
            if not pdl_args:
                plain = got
            assert all(torch.equal(a, b) for a, b in zip(plain, got)), (cfg, pdl_args)


@pytest.mark.cuda
@needs_hopper
@pytest.mark.parametrize("num_splits", [1, 4])
def test_rotary_and_decode_attention_as_dependent_launches_give_the_plain_bits(num_splits):
    from kernels.attention_decode import paged_decode_attention_triton
    from kernels.rotary_cache import rotary_write_kv_triton

    heads, kv_heads, dim, block, seqs = 8, 2, 64, 16, 3
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(seqs, (heads + 2 * kv_heads) * dim, generator=gen).to(torch.bfloat16).cuda()
    cos_sin = torch.randn(256, dim, generator=gen).cuda()
    positions = torch.tensor([4, 32, 63], device="cuda")
    block_tables = torch.randperm(16, generator=gen)[:12].view(seqs, 4).to(torch.int32).cuda()
    slots = (block_tables[torch.arange(seqs), positions // block].long() * block + positions % block).cuda()
    seq_lens = (positions + 1).to(torch.int32)
    results = []
    for pdl in (False, True):
        caches = [torch.randn(16, block, kv_heads, dim, generator=torch.Generator().manual_seed(6)).to(
            torch.bfloat16).cuda() for _ in range(2)]
        q = rotary_write_kv_triton(positions, qkv, cos_sin, *caches, slots, heads, kv_heads, dim, pdl=pdl)
        out = paged_decode_attention_triton(q, *caches, block_tables, seq_lens, dim ** -0.5,
                                            num_splits=num_splits, pdl=pdl)
        results.append((q, out, *caches))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.cuda
@needs_hopper
def test_a_graph_of_dependent_launches_gives_the_plain_chains_bits():
    hidden, inter = 576, 1536
    layers = [(_w(960, hidden, 10 * i), _w(hidden, hidden, 10 * i + 1), _w(2 * inter, hidden, 10 * i + 2),
               _w(hidden, inter, 10 * i + 3), _w(1, hidden, 10 * i + 4)[0].add_(1.0)) for i in range(3)]
    head = _w(4000, hidden, 99)
    x, residual = _w(1, hidden, 100), _w(1, hidden, 101)
    expected = _chain(x, residual, layers, head, pdl=False)
    eager = _chain(x, residual, layers, head, pdl=True)  # (compiled outside the capture)
    assert torch.equal(eager[0], expected[0]) and torch.equal(eager[1], expected[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits, res = _chain(x, residual, layers, head, pdl=True)
    for _ in range(3):
        logits.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(logits, expected[0]) and torch.equal(res, expected[1])


def test_the_executor_switch(monkeypatch):
    assert ExecutorConfig.from_args(["--model", "m"]).pdl is True  # on by default
    assert ExecutorConfig.from_args(["--model", "m", "--no-pdl"]).pdl is False
    monkeypatch.setenv("LLMSERVE_EXECUTOR_PDL", "0")
    assert ExecutorConfig.from_args(["--model", "m"]).pdl is False
    assert ExecutorConfig.from_args(["--model", "m", "--pdl"]).pdl is True


@pytest.mark.cuda
@needs_hopper
def test_a_runner_with_pdl_decodes_the_plain_tokens_in_graphs_and_eagerly(tmp_path):
    """A tiny bf16 llama built with --pdl (skinny path up to 16 rows): eager decode tokens equal
    those with pdl off (batches 1 and 5), and its captured graphs replay the eager tokens."""
    from executor_svc.model_loader.random_model import build_random_model
    from tests.executor.cuda_helpers import Driver, check_graph_tokens_equal_eager, cuda_runner

    runner = cuda_runner(build_random_model(tmp_path / "m", "tiny-llama"), pdl=True, skinny_max_tokens=16,
                         max_num_seqs=16, cuda_graph_sizes=(1, 2, 4, 8, 16), mixed_cuda_graph_sizes=(64, 224),
                         num_kv_blocks=16 * 16 + 1)
    assert runner.model.pdl and runner.model.skinny_max_tokens == 16
    runner.use_graphs(False)
    try:
        for num_reqs in (1, 5):
            tokens = {}
            for pdl in (False, True):
                runner.model.pdl = pdl
                driver = Driver(runner, num_reqs)
                driver.decode(6)
                tokens[pdl] = driver.tokens
            assert tokens[False] == tokens[True], num_reqs
    finally:
        runner.use_graphs(True)
    for num_reqs in (1, 5):
        check_graph_tokens_equal_eager(runner, num_reqs)
