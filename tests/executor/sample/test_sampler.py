"""Sampler: greedy, top-k/top-p cuts, seeded reproducibility, distribution."""

from __future__ import annotations

import torch

from executor_svc.sample.ops import SamplingTensors, apply_top_k_top_p, sample, uniform_noise

N, V = 6, 50


def _params(temperature=1.0, top_k=0, top_p=1.0, seeds=None, positions=None, n=N) -> SamplingTensors:
    temps = torch.full((n,), float(temperature))
    top_k_t, top_p_t = torch.full((n,), top_k, dtype=torch.int64), torch.full((n,), float(top_p))
    return SamplingTensors(
        temperature=temps, top_k=top_k_t, top_p=top_p_t,
        seeds=torch.arange(n, dtype=torch.int64) if seeds is None else seeds,
        positions=torch.zeros(n, dtype=torch.int64) if positions is None else positions,
        all_greedy=bool((temps == 0).all()), need_top_k_top_p=bool(top_k > 0 or top_p < 1.0))


def _logits(n=N) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_argmax():
    logits = _logits()
    assert torch.equal(sample(logits, _params(temperature=0.0)), logits.argmax(-1))


def test_greedy_rows_mixed_with_sampled_rows():
    logits = _logits()
    params = _params()
    params.temperature[::2] = 0.0
    out = sample(logits, params)
    assert torch.equal(out[::2], logits.argmax(-1)[::2])


def test_top_k_1_and_tiny_top_p_are_argmax():
    logits = _logits()
    for seed in range(5):
        seeds = torch.full((N,), seed, dtype=torch.int64)
        assert torch.equal(sample(logits, _params(top_k=1, seeds=seeds)), logits.argmax(-1))
        assert torch.equal(sample(logits, _params(top_p=1e-6, seeds=seeds)), logits.argmax(-1))


def test_top_k_keeps_only_k_best():
    logits = _logits(1).expand(400, V)
    positions = torch.arange(400)
    out = sample(logits, _params(temperature=5.0, top_k=3, positions=positions, seeds=torch.zeros(400, dtype=torch.int64), n=400))
    assert set(out.tolist()) <= set(logits[0].topk(3).indices.tolist())
    assert len(set(out.tolist())) == 3


def test_a_row_without_a_cut_draws_the_same_beside_rows_that_cut():
    """A row with top_k = 0 and top_p = 1 keeps every token on the sorting path (taken when any
    row of its step cuts), so its draw does not depend on its neighbours. Before the fix, its
    cumulative probability rounded to 1 early and ~15% of a 128k vocabulary was cut."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 128256, generator=g) * 3
    kept = apply_top_k_top_p(logits, torch.zeros(64, dtype=torch.int64), torch.ones(64))
    assert bool(torch.isfinite(kept).all())
    alone = sample(logits, _params(n=64))  # the one-pass path (no row cuts)
    beside = _params(n=64)
    beside.top_k[0], beside.need_top_k_top_p = 5, True  # row 0 cuts: every row takes the sorting path
    assert torch.equal(sample(logits, beside)[1:], alone[1:])


def test_seeded_sampling_reproducible_and_seed_dependent():
    logits = _logits(1).expand(64, V)
    positions = torch.arange(64)
    a = sample(logits, _params(seeds=torch.full((64,), 7), positions=positions, n=64))
    b = sample(logits, _params(seeds=torch.full((64,), 7), positions=positions, n=64))
    c = sample(logits, _params(seeds=torch.full((64,), 8), positions=positions, n=64))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_noise_is_uniform_and_large_seeds_work():
    seeds = torch.tensor([0, 1, (1 << 62) + 12345])
    u = uniform_noise(seeds, torch.tensor([0, 3, 9]), 20000)  # [3, 20000]
    assert 0.0 < u.min() and u.max() < 1.0
    assert torch.allclose(u.mean(-1), torch.full((3,), 0.5), atol=0.01)
    hist = torch.histc(u[2], bins=10, min=0, max=1)
    assert (hist - 2000).abs().max() < 200


def test_temperature_sampling_matches_softmax():
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    draws = 20000
    logits = base.expand(draws, 5)
    params = SamplingTensors(
        temperature=torch.full((draws,), 0.8), top_k=torch.zeros(draws, dtype=torch.int64),
        top_p=torch.ones(draws), seeds=torch.full((draws,), 3, dtype=torch.int64),
        positions=torch.arange(draws), all_greedy=False, need_top_k_top_p=False)
    freq = torch.bincount(sample(logits, params), minlength=5).float() / draws
    assert torch.allclose(freq, torch.softmax(base / 0.8, -1), atol=0.02)


def _previous_sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """sample() as it was before kernels.gumbel_sample (one torch expression), verbatim."""
    from executor_svc.sample.ops import apply_top_k_top_p

    greedy = logits.argmax(dim=-1)
    if params.all_greedy:
        return greedy
    temperature = params.temperature.clamp_min(1e-5)[:, None]
    scaled = logits / temperature
    if params.need_top_k_top_p:
        scaled = apply_top_k_top_p(scaled, params.top_k, params.top_p)
    u = uniform_noise(params.seeds, params.positions, logits.shape[-1])
    gumbel = -torch.log(-torch.log(u))
    sampled = (scaled + gumbel).argmax(dim=-1)
    return torch.where(params.temperature > 0, sampled, greedy)


def test_sample_matches_previous_implementation():
    gen = torch.Generator().manual_seed(5)
    n, vocab = 96, 700
    logits = torch.randn(n, vocab, generator=gen) * 4
    logits[::5, 10] = logits[::5, 20] = 50.0  # tied maxima: greedy takes the lowest index
    logits[1::7, 100:] = float("-inf")
    logits[3, 0] = 1e-3  # close logits that x / 1e-5 may round to a tie
    logits[3, 1] = torch.nextafter(torch.tensor(1e-3), torch.tensor(1.0))
    logits[3, 2:] = -1.0
    temps = torch.rand(n, generator=gen) * 1.4 + 0.2
    temps[::4] = 0.0
    top_k = torch.randint(0, 5, (n,), generator=gen)
    top_p = torch.where(torch.rand(n, generator=gen) < 0.5, torch.rand(n, generator=gen), torch.ones(n))
    seeds = torch.randint(0, 1 << 62, (n,), generator=gen)
    positions = torch.randint(0, 1 << 16, (n,), generator=gen)
    for cut in (False, True):
        params = SamplingTensors(
            temperature=temps, top_k=top_k if cut else torch.zeros_like(top_k), top_p=top_p if cut else torch.ones(n),
            seeds=seeds, positions=positions, all_greedy=False, need_top_k_top_p=cut)
        assert torch.equal(sample(logits, params), _previous_sample(logits, params))
    greedy = _params(temperature=0.0, n=n)
    assert torch.equal(sample(logits, greedy), _previous_sample(logits, greedy))
