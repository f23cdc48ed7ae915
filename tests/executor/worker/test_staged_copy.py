"""host_device.Staged, packing on CPU as on CUDA: arrays of several dtypes in one buffer, each
16-byte aligned, values exact (empty arrays too), two staging sets by parity, and a step larger
than the staging through fresh memory."""

from __future__ import annotations

import numpy as np
import torch

from executor_svc.worker.host_device import Staged

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
