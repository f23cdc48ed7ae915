"""Host <-> device copies of the executor, in one place.

Twin and TwinGroup: static buffers allocated once, a pinned host side (double-buffered on CUDA)
and a device side, copied non-blocking each step (step_buffers.py, the sampler's columns,
the draft's inputs). to_device / to_device_packed: arrays made on the fly (a request's tables,
the verify rows), staged through pinned memory and copied non-blocking: a pageable copy would
wait for the step in flight and break the one-step-ahead overlap (torch's pinned allocator
keeps each staging tensor alive until its copy has run). to_host: a device tensor's
non-blocking copy into fresh pinned memory, read after the step's completion event.
On CPU every "copy" is the tensor itself, or a plain one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class Twin:
    """A host buffer and its device twin (the same tensor on CPU). Host side pinned on CUDA.

    On CUDA the host side is double-buffered: `use_host(i)` selects set i % 2, so the next
    step can be prepared on the host while the previous step's non-blocking copies out of the
    other set may still be pending. The device twin stays single (stream order protects it).
    A twin built by a TwinGroup is a view into the group's buffers instead.
    """

    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill=0, *, views=None):
        pin = device.type == "cuda"
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if views is None:
            self.hosts = [torch.full(shape, fill, dtype=dtype, pin_memory=pin) for _ in range(2 if pin else 1)]
            self.gpu = torch.full(shape, fill, dtype=dtype, device=device) if pin else self.hosts[0]
        else:  # (host views, device view): on CPU the device view is hosts[0] itself
            self.hosts, self.gpu = views
            for t in {id(t): t for t in (*self.hosts, self.gpu)}.values():
                t.fill_(fill)
        self.nps = [h.numpy() for h in self.hosts]  # fast host writes
        self.cpu, self.np = self.hosts[0], self.nps[0]

    def use_host(self, i: int) -> None:
        """Selects host set i (mod the number of sets) as `.cpu` / `.np`."""
        i %= len(self.hosts)
        self.cpu, self.np = self.hosts[i], self.nps[i]

    def copy_to_device(self, n: int) -> torch.Tensor:
        """Copies the first n rows (non-blocking) and returns the device view of them."""
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class TwinSpec(NamedTuple):
    """One member of a TwinGroup: a 1-D buffer of `size` elements, initially `fill`."""

    size: int
    dtype: torch.dtype
    fill: float = 0


class TwinGroup:
    """Small 1-D twins packed into one byte buffer per host set (and one on the device), so a
    step copies all of them with one non-blocking copy. `twins` are the members in spec order:
    contiguous views at fixed 64-byte aligned offsets (stable device addresses, as the graphs
    need)."""

    ALIGN = 64

    def __init__(self, device: torch.device, specs: list[TwinSpec]):
        pin = device.type == "cuda"
        nbytes = [s.size * torch.empty((), dtype=s.dtype).element_size() for s in specs]
        offsets, total = [], 0
        for n in nbytes:
            offsets.append(total)
            total += -(-n // self.ALIGN) * self.ALIGN
        self.hosts = [torch.zeros(total, dtype=torch.uint8, pin_memory=pin) for _ in range(2 if pin else 1)]
        self.gpu = torch.zeros(total, dtype=torch.uint8, device=device) if pin else self.hosts[0]
        self.cpu = self.hosts[0]
        self.twins: list[Twin] = []
        for spec, start, n in zip(specs, offsets, nbytes):
            hosts = [h[start:start + n].view(spec.dtype) for h in self.hosts]
            gpu = self.gpu[start:start + n].view(spec.dtype) if pin else hosts[0]
            self.twins.append(Twin(spec.size, spec.dtype, device, spec.fill, views=(hosts, gpu)))

    def use_host(self, i: int) -> None:
        self.cpu = self.hosts[i % len(self.hosts)]
        for twin in self.twins:
            twin.use_host(i)

    def copy_to_device(self) -> None:
        """Copies the whole group (every member, all rows) in one non-blocking copy."""
        if self.gpu is not self.cpu:
            self.gpu.copy_(self.cpu, non_blocking=True)


def to_device(a: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array (numpy or a CPU tensor) on `device`, non-blocking through pinned staging on CUDA."""
    host = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, host: torch.Tensor) -> None:
    """dst.copy_(host), non-blocking through pinned staging when dst is on CUDA."""
    dst.copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=True)


def to_device_packed(arrays: list[np.ndarray], dtype, device: torch.device) -> list[torch.Tensor]:
    """Several arrays of one dtype in ONE host -> device copy (packed, then split back into
    device views of the arrays' shapes)."""
    packed = to_device(np.concatenate([np.asarray(a, dtype=dtype).ravel() for a in arrays]), device)
    views, start = [], 0
    for a in arrays:
        size = int(np.prod(np.shape(a), dtype=np.int64))
        views.append(packed[start:start + size].view(np.shape(a)))
        start += size
    return views


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t: enqueued non-blocking into pinned memory on CUDA (read it after the
    stream has passed this point), a plain clone on CPU."""
    if not t.is_cuda:
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
