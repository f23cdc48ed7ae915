"""Host <-> device copies of the executor, in one place.

Twin and TwinGroup: static buffers allocated once, a pinned host side (HOST_SETS sets on CUDA)
and a device side, copied non-blocking each step (the sampler's columns, the draft's inputs).
PackedTwins: a step's inputs (step_buffers.py) packed for its shape into one copy (staged.py:
arrays made each step, and device results going back, through persistent pinned memory). to_device: an
array made on the fly (a request's tables), staged through pinned memory and copied
non-blocking: a pageable copy would wait for the step in flight and break the one-step-ahead
overlap (torch's pinned allocator keeps each staging tensor alive until its copy has run). to_host: a device tensor's
non-blocking copy into fresh pinned memory, read after the step's completion event.
On CPU every "copy" is the tensor itself, or a plain one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

# Host buffer sets on CUDA, one per step that may be launched and not yet finished: a step writes
# set (its parity) while the HOST_SETS - 1 steps before it may still be copying out of theirs. So
# the runner launches up to HOST_SETS steps ahead of the one it finishes (model_runner.py), and
# the device process keeps as many unanswered (service/step_threads.py). Three, not two: with two,
# a step's launch waited for the answer of the step two back, and a launch of ~1 ms (a verify
# step) alternated with the finishing instead of overlapping it (docs/executor.md).
HOST_SETS = 3


class Twin:
    """A host buffer and its device twin (the same tensor on CPU). Host side pinned on CUDA.

    On CUDA the host side has HOST_SETS sets: `use_host(i)` selects set i % HOST_SETS, so the
    next step can be prepared on the host while the earlier steps' non-blocking copies out of
    the other sets may still be pending. The device twin stays single (stream order protects it).
    A twin built by a TwinGroup is a view into the group's buffers instead.
    """

    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill=0, *, views=None):
        pin = device.type == "cuda"
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if views is None:
            self.hosts = [torch.full(shape, fill, dtype=dtype, pin_memory=pin) for _ in range(HOST_SETS if pin else 1)]
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
        self.hosts = [torch.zeros(total, dtype=torch.uint8, pin_memory=pin) for _ in range(HOST_SETS if pin else 1)]
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


class PackedSpec(NamedTuple):
    """One member of a PackedTwins: rows of `row` elements each, as many rows as the step's
    tokens ("tokens") or requests ("reqs"), plus `extra`; initially `fill` on the host."""

    per: str  # "tokens" | "reqs"
    dtype: torch.dtype
    row: int = 1  # elements per row (a block table: max_blocks_per_seq)
    extra: int = 0  # more rows (query_start_loc: requests + 1)
    fill: float = 0


class PackedMember:
    """One input of a PackedTwins: `np`, the host array at full capacity (plain memory: only the
    copy reads it, at once), and `gpu`, the device view of the layout copied last (on CPU the
    host array itself, as a tensor)."""

    def __init__(self, spec: PackedSpec, rows: int, packs: bool):
        shape = (rows,) if spec.row == 1 else (rows, spec.row)
        self.np = np.full(shape, spec.fill, dtype=torch.empty((), dtype=spec.dtype).numpy().dtype)
        self.gpu = None if packs else torch.from_numpy(self.np)

    def rows(self, spec: PackedSpec, num_reqs: int, num_tokens: int) -> int:
        return (num_tokens if spec.per == "tokens" else num_reqs) + spec.extra


class _Layout(NamedTuple):
    nbytes: int
    rows: tuple[int, ...]  # of each member
    gpu: tuple[torch.Tensor, ...]  # each member's device view
    staging: tuple[tuple[np.ndarray, ...], ...]  # per host set: each member's view of the staging


class PackedTwins:
    """The inputs of a step of B requests and T tokens in ONE non-blocking host -> device copy.

    Each member has a host array at full capacity; a copy packs the first rows of each (T or B
    of them, and `extra`) contiguously, 64-byte aligned, into pinned staging (HOST_SETS sets, like a
    Twin's host side: `use_host`), copies the packed bytes, and points every member's `gpu` at
    its rows in the device buffer. The layout depends on (B, T) alone, so a graph captured over
    the layout of its shape reads the same addresses at every replay of that shape; a step
    padded to a graph's shape is copied at that shape. On CPU nothing is copied (`gpu` is the
    host array) unless `pack` is set (the tests of the CUDA layout, on CPU)."""

    ALIGN = 64
    MAX_LAYOUTS = 512  # eager steps of many shapes: the cache is emptied when it is full

    def __init__(self, device: torch.device, specs: list[PackedSpec], max_reqs: int, max_tokens: int,
                 pack: bool | None = None):
        self.device, self.specs = device, specs
        self.packs = device.type == "cuda" if pack is None else pack
        self.members = [PackedMember(s, (max_tokens if s.per == "tokens" else max_reqs) + s.extra, self.packs)
                        for s in specs]
        self._layouts: dict[tuple[int, int], _Layout] = {}
        self._set = 0
        self.last: tuple[int, int] | None = None  # (B, T) of the last copy: the layout the device holds
        if self.packs:
            total = self._offsets(max_reqs, max_tokens)[1]
            pin = device.type == "cuda"
            self.staging = [torch.empty(total, dtype=torch.uint8, pin_memory=pin) for _ in range(HOST_SETS)]
            self.dev = torch.zeros(total, dtype=torch.uint8, device=device)

    def use_host(self, i: int) -> None:
        self._set = i % HOST_SETS

    def copy_to_device(self, num_reqs: int, num_tokens: int) -> None:
        """Packs the first rows of every member for a step of num_reqs requests and num_tokens
        tokens, and enqueues their one non-blocking copy; members' `gpu` now view them."""
        if not self.packs:
            return
        lay = self._layouts.get((num_reqs, num_tokens)) or self._layout(num_reqs, num_tokens)
        for member, rows, dst in zip(self.members, lay.rows, lay.staging[self._set]):
            dst[...] = member.np[:rows]
        self.dev[:lay.nbytes].copy_(self.staging[self._set][:lay.nbytes], non_blocking=True)
        for member, view in zip(self.members, lay.gpu):
            member.gpu = view
        self.last = (num_reqs, num_tokens)

    def _offsets(self, num_reqs: int, num_tokens: int) -> tuple[list[tuple[int, int, int]], int]:
        """(rows, offset, bytes) of each member, and the layout's bytes."""
        out, total = [], 0
        for spec, member in zip(self.specs, self.members):
            rows = member.rows(spec, num_reqs, num_tokens)
            n = rows * spec.row * member.np.itemsize
            out.append((rows, total, n))
            total += -(-n // self.ALIGN) * self.ALIGN
        return out, total

    def _layout(self, num_reqs: int, num_tokens: int) -> _Layout:
        offsets, total = self._offsets(num_reqs, num_tokens)
        gpu, staging = [], [[] for _ in self.staging]
        for spec, member, (rows, start, n) in zip(self.specs, self.members, offsets):
            shape = member.np[:rows].shape
            gpu.append(self.dev[start:start + n].view(spec.dtype).view(shape))
            for s, host in zip(staging, self.staging):
                s.append(host[start:start + n].numpy().view(member.np.dtype).reshape(shape))
        if len(self._layouts) >= self.MAX_LAYOUTS:
            self._layouts.clear()
        lay = self._layouts[(num_reqs, num_tokens)] = _Layout(total, tuple(r for r, _, _ in offsets), tuple(gpu),
                                                              tuple(tuple(s) for s in staging))
        return lay


def to_device(a: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array (numpy or a CPU tensor) on `device`, non-blocking through pinned staging on CUDA."""
    host = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, host: torch.Tensor) -> None:
    """dst.copy_(host), non-blocking through pinned staging when dst is on CUDA."""
    dst.copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t: enqueued non-blocking into pinned memory on CUDA (read it after the
    stream has passed this point), a plain clone on CPU."""
    if not t.is_cuda:
        return t.clone()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
