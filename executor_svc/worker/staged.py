"""Arrays made each step, through persistent pinned memory: Staged (host -> device, a step's
made columns in one copy) and PinnedOut (device -> host, a step's results); the host<->device
helpers of host_device.py make fresh pinned memory instead."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from executor_svc.worker.host_device import HOST_SETS, to_host


class Staged:
    """Arrays made each step (the verify rows' columns) in ONE non-blocking copy: packed, each
    16-byte aligned, into persistent pinned staging (HOST_SETS sets, by step parity: a set is written
    again only after the step that used it two launches ago was finished) and copied into one
    persistent device buffer (stream order: the last step's kernels read it before this copy
    lands). Device views in the arrays' shapes are returned; the views of a set of shapes are
    made once (a step's shapes repeat: its rows and drafts). A step larger than `nbytes` stages
    through fresh pinned memory. On CPU the views are the arrays themselves, as tensors, unless
    `pack` (the tests of the CUDA path, on CPU)."""

    ALIGN = 16
    MAX_LAYOUTS = 256  # shape sets kept (forgotten all at once past it)

    def __init__(self, nbytes: int, device: torch.device, pack: bool | None = None):
        self.device, self.nbytes = device, nbytes
        self.packs = device.type == "cuda" if pack is None else pack
        self._layouts: dict[tuple, _StagedLayout] = {}
        if self.packs:
            pin = device.type == "cuda"
            self.hosts = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(HOST_SETS)]
            self.dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def to_device(self, arrays: list[tuple[np.ndarray, type]], parity: int) -> list[torch.Tensor]:
        """[(array, numpy dtype)] -> their device tensors, in one copy."""
        if not self.packs:
            return [torch.from_numpy(np.ascontiguousarray(a, dtype=dt)) for a, dt in arrays]
        key = tuple((np.shape(a), dt) for a, dt in arrays)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layout(key)
        if lay is None:  # larger than the staging: fresh pinned memory
            host = torch.empty(_packed_bytes(key)[1], dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            dev = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
            lay = _staged_views(key, [host], dev)
            parity = 0
        else:
            host, dev = self.hosts[parity % HOST_SETS], self.dev
        for (a, _), view in zip(arrays, lay.hosts[parity % HOST_SETS]):
            view[...] = a
        dev[:lay.nbytes].copy_(host[:lay.nbytes], non_blocking=True)
        return list(lay.views)

    def _layout(self, key: tuple) -> _StagedLayout | None:
        if _packed_bytes(key)[1] > self.nbytes:
            return None
        if len(self._layouts) >= self.MAX_LAYOUTS:
            self._layouts.clear()
        lay = self._layouts[key] = _staged_views(key, self.hosts, self.dev)
        return lay


class _StagedLayout(NamedTuple):
    nbytes: int
    hosts: tuple[tuple[np.ndarray, ...], ...]  # per host set: each array's view in the staging
    views: tuple[torch.Tensor, ...]  # each array's device view


def _packed_bytes(key: tuple) -> tuple[list[int], int]:
    """(start of each array, total bytes) of arrays of these (shape, dtype), each 16-byte aligned."""
    starts, total = [], 0
    for shape, dt in key:
        starts.append(total)
        total += -(-int(np.prod(shape)) * np.dtype(dt).itemsize // Staged.ALIGN) * Staged.ALIGN
    return starts, total


def _staged_views(key: tuple, hosts: list[torch.Tensor], dev: torch.Tensor) -> _StagedLayout:
    starts, total = _packed_bytes(key)
    host_views: list[tuple[np.ndarray, ...]] = []
    for host in hosts:
        staging = host.numpy()
        host_views.append(tuple(staging[start:start + int(np.prod(shape)) * np.dtype(dt).itemsize].view(dt)
                                .reshape(shape) for (shape, dt), start in zip(key, starts)))
    views = tuple(dev[start:start + int(np.prod(shape)) * np.dtype(dt).itemsize]
                  .view(torch.from_numpy(np.zeros(0, dt)).dtype).view(shape) for (shape, dt), start in zip(key, starts))
    return _StagedLayout(total, tuple(host_views), views)


class PinnedOut:
    """Device tensors made each step (a verify step's outcome) copied non-blocking into
    persistent pinned memory: HOST_SETS sets by step parity (a set is written again only after the
    step that used it two launches ago was finished and read), each tensor 16-byte aligned; one
    that no longer fits takes fresh pinned memory (to_host). On CPU: plain clones."""

    def __init__(self, nbytes: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.hosts = ([torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(HOST_SETS)]
                      if self.cuda else [])

    def copy(self, tensors: list[torch.Tensor], parity: int) -> list[torch.Tensor]:
        """Their host copies, to be read after the stream has passed this point."""
        if not self.cuda:
            return [t.clone() for t in tensors]
        host, out, start = self.hosts[parity % HOST_SETS], [], 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if start + n > host.numel():
                out.append(to_host(t))
                continue
            view = host[start:start + n].view(t.dtype).view(t.shape)
            view.copy_(t, non_blocking=True)
            out.append(view)
            start += -(-n // Staged.ALIGN) * Staged.ALIGN
        return out
