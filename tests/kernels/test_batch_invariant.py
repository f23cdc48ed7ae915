"""The kernels of --deterministic (docs/deterministic.md): a row's result is bit for bit the
same whatever other rows share its step.

- linear_invariant (kernels/gemm_invariant.py): a row alone and the same row at any place in
  batches of 2..1024 (CUDA; 2..130 interpreted) random others, with and without bias, into an
  out buffer of another dtype; close to the reference; the CPU reference is per row.
- paged_attention(batch_invariant=True): every token of a prefill equals the same token
  computed as a decode step, as a chunk of a chunked prefill and inside a mixed step beside
  other requests, with and without a sliding window (keys before the window never read: a
  NaN there changes nothing); close to the reference, whose invariant form is checked alike.

Triton tests: CUDA, or CPU under TRITON_INTERPRET=1 (fp16: the interpreter's tl.dot mishandles
bf16); the reference tests always run."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as ref
from tests.kernels.kernel_cases import DEVICE, ON_CUDA, TRITON_MARKS, make_case, rel_err

DTYPE = torch.bfloat16 if ON_CUDA else torch.float16
K, N = (2048, 4099) if ON_CUDA else (96, 200)  # interpreted: a partial K tile and a partial N tile
BATCHES = [1, 2, 7, 64, 65, 130] + ([257, 1024] if ON_CUDA else [])


def triton_test(fn):
    for mark in TRITON_MARKS:
        fn = mark(fn)
    return fn


def _rows(m, seed, dtype=DTYPE, k=K):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def _weights(dtype=DTYPE, bias=True):
    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(N, K, generator=gen) * 0.05).to(dtype).to(DEVICE)
    b = (torch.randn(N, generator=gen) * 0.1).to(dtype).to(DEVICE) if bias else None
    return w, b


@triton_test
@pytest.mark.parametrize("bias,split_k", [(True, 1), (False, 1), (True, 3), (False, None)])  # 3: a short, an empty range
def test_a_gemm_row_is_the_same_in_every_batch(bias, split_k):
    """Alone through the range sums apart (the launch of few rows), in batches through either
    launch, the one-program launch also folded into one K loop: M picks the launch (split_k
    None: the shape's split and M's launch, as the model)."""
    from kernels.gemm_invariant import linear_invariant_triton

    w, b = _weights(bias=bias)
    row = _rows(1, 1)
    alone = linear_invariant_triton(row, w, b, split_k=split_k, partials=split_k is not None or None)
    assert rel_err(alone, ref.linear_invariant_reference(row, w, b)) < 1e-2
    for i, m in enumerate(BATCHES):
        batch = _rows(m, 100 + m)
        at = (37 * m) % m
        batch[at] = row[0]
        partials = None if split_k is None else i % 3 == 0
        fold = split_k is not None and i % 3 == 2  # the one-program launch as one K loop
        out = linear_invariant_triton(batch, w, b, split_k=split_k, partials=partials, fold=fold)
        assert torch.equal(out[at], alone[0]), f"row {at} of {m} differs from the row alone"
        assert rel_err(out, ref.linear_invariant_reference(batch, w, b)) < 1e-2


@triton_test
def test_gemm_out_buffer_and_leading_dims():
    from kernels.gemm_invariant import linear_invariant_triton

    w, b = _weights()
    x = _rows(6, 3).reshape(2, 3, K)
    y = linear_invariant_triton(x, w, b)
    assert y.shape == (2, 3, N) and y.dtype == DTYPE
    out = torch.full((6, N), float("nan"), dtype=torch.float32, device=DEVICE)
    assert linear_invariant_triton(x, w, b, out=out) is out
    # one rounding from fp32: the out buffer holds more than the DTYPE result, which it rounds to
    assert torch.equal(out.to(DTYPE), y.reshape(6, N))
    assert linear_invariant_triton(_rows(0, 4), w, b).shape == (0, N)


@triton_test
def test_gemm_refuses_bad_arguments():
    from kernels.gemm_invariant import linear_invariant_triton

    w, b = _weights()
    x = _rows(2, 5)
    with pytest.raises(ValueError, match="weight must be"):
        linear_invariant_triton(x, w[:, :K - 1].contiguous(), b)
    with pytest.raises(ValueError, match="weight dtype"):
        linear_invariant_triton(x, w.float(), b)
    with pytest.raises(ValueError, match="bias must have"):
        linear_invariant_triton(x, w, b[:-1])
    with pytest.raises(ValueError, match="out must be"):
        linear_invariant_triton(x, w, b, out=torch.empty(3, N, dtype=DTYPE, device=DEVICE))
    for split_k in (0, 17):
        with pytest.raises(ValueError, match="split_k must be in"):
            linear_invariant_triton(x, w, b, split_k=split_k)


def test_gemm_reference_and_cpu_dispatch_are_per_row():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(50, 40, generator=gen), torch.randn(50, generator=gen)
    batch = torch.randn(9, 40, generator=gen)
    out = kernels.linear_invariant(batch, w, b)
    for i in range(9):
        assert torch.equal(out[i], kernels.linear_invariant(batch[i:i + 1], w, b)[0])
    torch.testing.assert_close(out, torch.nn.functional.linear(batch, w, b), rtol=1e-5, atol=1e-5)
    buf = torch.empty(9, 50)
    assert kernels.linear_invariant(batch, w, b, out=buf) is buf and torch.equal(buf, out)


SEQ = 150  # three 64-token key tiles, the last partial


def _attend(case, q, block_rows, seq_lens, q_lens, window, invariant=True):
    """paged_attention over case's caches: request i reads block table row block_rows[i]."""
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    tables = case.block_tables[torch.tensor(block_rows, device=DEVICE)]
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return kernels.paged_attention(q, case.k_cache, case.v_cache, tables, lens, qsl, case.scale,
                                   max(q_lens), max(seq_lens), window or None, batch_invariant=invariant)


def _check_token_views(case, window, prefill):
    """Each listed view of the sequence's tokens equals the prefill's rows, bit for bit."""
    q = case.q
    for p in (0, 1, 63, 64, 100, SEQ - 1):  # decode steps at positions across the tiles
        out = _attend(case, q[p:p + 1], [0], [p + 1], [1], window)
        assert torch.equal(out[0], prefill[p]), f"decode at {p}"
    for a, b in ((0, 37), (37, 101), (101, SEQ)):  # a chunked prefill
        out = _attend(case, q[a:b], [0], [b], [b - a], window)
        assert torch.equal(out, prefill[a:b]), f"chunk {a}:{b}"
    # one mixed step: a decode, a chunk and another decode of the same context, as three requests
    out = _attend(case, torch.cat([q[70:71], q[5:40], q[149:150]]), [0, 0, 0], [71, 40, 150], [1, 35, 1], window)
    assert torch.equal(out[0], prefill[70]) and torch.equal(out[1:36], prefill[5:40])
    assert torch.equal(out[36], prefill[149])


@triton_test
@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2)])
def test_an_attention_token_is_the_same_in_every_step(window, num_heads, num_kv_heads):
    case = make_case([SEQ], [SEQ], num_heads, num_kv_heads, 64, 16, DTYPE, DEVICE, seed=3)
    prefill = _attend(case, case.q, [0], [SEQ], [SEQ], window)
    expected = ref.paged_attention_reference(case.q.cpu().float(), case.k_cache.cpu().float(),
                                             case.v_cache.cpu().float(), case.block_tables.cpu(),
                                             case.seq_lens.cpu(), case.query_start_loc.cpu(), case.scale, window or None)
    assert rel_err(prefill, expected) < 2e-2
    _check_token_views(case, window, prefill)
    if window:  # keys before a decode token's window are never read, even in the aligned key tile
        blocks = case.block_tables[0, :(SEQ - 1 - window + 1) // 16]
        case.k_cache[blocks.long()] = float("nan")
        case.v_cache[blocks.long()] = float("nan")
        out = _attend(case, case.q[SEQ - 1:], [0], [SEQ], [1], window)
        assert torch.equal(out[0], prefill[SEQ - 1])


@pytest.mark.parametrize("window", [0, 40])
def test_the_attention_reference_is_invariant_too(window):
    case = make_case([SEQ], [SEQ], 4, 2, 16, 16, torch.float32, "cpu", seed=4)
    cpu = type(case)(**{**case.__dict__})
    prefill = kernels.paged_attention(cpu.q, cpu.k_cache, cpu.v_cache, cpu.block_tables, cpu.seq_lens,
                                      cpu.query_start_loc, cpu.scale, SEQ, SEQ, window or None, batch_invariant=True)
    torch.testing.assert_close(prefill, ref.paged_attention_reference(
        cpu.q, cpu.k_cache, cpu.v_cache, cpu.block_tables, cpu.seq_lens, cpu.query_start_loc, cpu.scale,
        window or None), rtol=1e-5, atol=1e-5)
    if DEVICE == "cpu":
        _check_token_views(cpu, window, prefill)


@pytest.mark.cuda
@pytest.mark.skipif(not (ON_CUDA and torch.cuda.get_device_capability()[0] >= 9),
                    reason="needs CUDA, compute capability 9.0+")
def test_pdl_launches_chained_in_a_graph_give_the_plain_bits():
    """Two GEMMs, the second reading the first's output, as programmatic dependent launches
    captured in a CUDA graph (the model's use): the eager plain launches' bits, through both
    launches (1 row: the range sums apart; 512 rows: one program a tile)."""
    from kernels.gemm_invariant import linear_invariant_triton

    w, b = _weights()
    for m in (1, 512):
        x = _rows(m, 11)
        want = linear_invariant_triton(linear_invariant_triton(x, w, b)[:, :K], w, b)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):  # compile off the capture
            linear_invariant_triton(linear_invariant_triton(x, w, b, pdl=True)[:, :K], w, b, pdl=True)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = linear_invariant_triton(linear_invariant_triton(x, w, b, pdl=True)[:, :K], w, b, pdl=True)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(got, want), m


@pytest.mark.cuda
@pytest.mark.skipif(not ON_CUDA, reason="a property of the GPU's MMA instructions (the interpreter's "
                    "tl.dot is a numpy matmul, whose blocking changes with the tile's shape)")
@pytest.mark.parametrize("bias", [True, False])
def test_every_tile_gives_the_same_bits(bias):
    """The launch picks its output tile by M (TILE, TILE_MANY from MANY_ROWS rows): every
    candidate tile must give TILE's bits, with a split, through both launches."""
    from kernels.gemm_invariant import TILE, TILES, linear_invariant_triton

    w, b = _weights(bias=bias)
    for m in (64, 300, 2048):
        x = _rows(m, 20 + m)
        for partials in (False, True):
            want = linear_invariant_triton(x, w, b, split_k=4, partials=partials, tile=TILE)
            for name, tile in TILES.items():
                got = linear_invariant_triton(x, w, b, split_k=4, partials=partials, tile=tile)
                assert torch.equal(got, want), (name, m, partials)


@triton_test
@pytest.mark.parametrize("split_k", [3, 4, 5])  # 7 K tiles: ranges of 3,3,1 / 2,2,2,1 / 2,2,2,1,0
def test_the_three_launches_give_the_same_bits(split_k):
    """The range sums apart, one program walking the ranges, and that program's ranges folded
    into one K loop: the same bits, with short and empty last ranges."""
    from kernels.gemm_invariant import linear_invariant_triton

    k = 7 * 64
    x = _rows(5, 31, k=k)
    w = (torch.randn(N, k, generator=torch.Generator().manual_seed(8)) * 0.05).to(DTYPE).to(DEVICE)
    def run(**launch):  # into fp32: the sums' bits before the rounding to x's dtype
        return linear_invariant_triton(x, w, out=torch.empty(5, N, device=DEVICE), split_k=split_k, **launch)

    want = run(partials=True)
    assert torch.equal(run(partials=False), want)
    assert torch.equal(run(partials=False, fold=True), want)
