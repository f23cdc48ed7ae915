"""host_device.Staged, packing on CPU as on CUDA: arrays of several dtypes in one buffer, each
16-byte aligned, values exact (empty arrays too), two staging sets by parity, and a step larger
than the staging through fresh memory. PinnedOut (CUDA): device tensors' copies into persistent
pinned memory by parity, exact, and fresh memory past its size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor_svc.worker.staged import PinnedOut, Staged

CPU = torch.device("cpu")


def _arrays(gen, n: int):
    return [(gen.integers(-5, 10**6, n), np.int64), (np.zeros(0), np.int64), (gen.random(n + 3), np.float32),
            (gen.random(n) < 0.5, np.bool_), (gen.integers(0, 100, (2, n)), np.int64)]


def test_each_array_comes_back_exact_and_aligned_in_one_buffer():
    staged = Staged(4096, CPU, pack=True)
    gen = np.random.default_rng(0)
    for parity, n in ((0, 5), (1, 7), (0, 1)):
        arrays = _arrays(gen, n)
        views = staged.to_device(arrays, parity)
        base = staged.dev.data_ptr()
        for (a, dt), v in zip(arrays, views):
            assert v.dtype == torch.from_numpy(np.zeros(0, dt)).dtype and tuple(v.shape) == np.shape(a)
            np.testing.assert_array_equal(v.numpy(), np.asarray(a, dtype=dt))
            if v.numel():  # (an empty tensor's data_ptr is 0)
                assert base <= v.data_ptr() < base + staged.nbytes and (v.data_ptr() - base) % Staged.ALIGN == 0
        assert staged.hosts[parity].numpy()[:16].view(np.int64)[0] == arrays[0][0][0]  # staged in set `parity`


def test_a_step_larger_than_the_staging_takes_fresh_memory():
    staged = Staged(64, CPU, pack=True)
    a = np.arange(100)
    (v,) = staged.to_device([(a, np.int64)], 0)
    np.testing.assert_array_equal(v.numpy(), a)
    assert not (staged.dev.data_ptr() <= v.data_ptr() < staged.dev.data_ptr() + 64)


def test_on_cpu_without_pack_the_arrays_are_the_tensors():
    staged = Staged(64, CPU)
    a = np.arange(4)
    (v,) = staged.to_device([(a, np.int64)], 1)
    assert v.data_ptr() == a.__array_interface__["data"][0]


def test_repeated_shapes_reuse_their_views_and_each_set_keeps_its_values():
    staged = Staged(4096, CPU, pack=True)
    gen = np.random.default_rng(1)
    first, second = _arrays(gen, 6), _arrays(gen, 6)
    views0 = staged.to_device(first, 0)
    views1 = staged.to_device(second, 1)
    assert all(a is b for a, b in zip(views0, views1))  # one layout for these shapes
    assert len(staged._layouts) == 1
    for (a, dt), v in zip(second, views1):
        np.testing.assert_array_equal(v.numpy(), np.asarray(a, dtype=dt))
    # set 0 still holds the first step's values (its copy may not have run yet on CUDA)
    assert staged.hosts[0].numpy()[:48].view(np.int64)[:6].tolist() == first[0][0].tolist()
    assert staged.hosts[1].numpy()[:48].view(np.int64)[:6].tolist() == second[0][0].tolist()


def test_pinned_out_on_cpu_clones():
    t = torch.arange(5)
    (h,) = PinnedOut(64, CPU).copy([t], 0)
    assert torch.equal(h, t) and h.data_ptr() != t.data_ptr()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_out_copies_into_its_parity_set_and_past_it_into_fresh_memory():
    out = PinnedOut(256, torch.device("cuda"))
    tensors = [torch.arange(12, device="cuda").view(3, 4), torch.tensor([1, 0, 1], device="cuda", dtype=torch.bool),
               torch.arange(7, device="cuda", dtype=torch.int32)]
    for parity in (0, 1):
        host = out.copy(tensors, parity)
        torch.cuda.synchronize()
        base = out.hosts[parity].data_ptr()
        for t, h in zip(tensors, host):
            assert torch.equal(h, t.cpu()) and h.is_pinned()
            assert base <= h.data_ptr() < base + 256 and (h.data_ptr() - base) % 16 == 0
    big = torch.arange(100, device="cuda")  # 800 bytes: past the set
    (h,) = out.copy([big], 0)
    torch.cuda.synchronize()
    assert torch.equal(h, big.cpu()) and h.is_pinned()
    assert not (out.hosts[0].data_ptr() <= h.data_ptr() < out.hosts[0].data_ptr() + 256)
