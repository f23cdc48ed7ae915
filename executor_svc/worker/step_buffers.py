"""The static inputs of a step: host buffers and their device twins, allocated once at the largest
size; a step writes the first rows on the host and copies them (non-blocking) to the device."""

from __future__ import annotations

from typing import NamedTuple

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


class StepBuffers:
    """Static inputs of one step, allocated once at the largest size; a step fills the first rows.

    Per-token buffers and the block tables are copied row-prefix by row-prefix; the small
    per-request and per-sample buffers live in one TwinGroup (`small`), copied whole at once.
    T = tokens of the step, B = its requests, N = its requests that sample."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 device: torch.device):
        t, s, d = max_num_tokens, max_num_seqs, device
        self.max_num_seqs, self.max_num_tokens, self.device = max_num_seqs, max_num_tokens, device
        self.input_ids = Twin(t, torch.int64, d)  # [T] known input tokens
        self.use_last = Twin(t, torch.bool, d)  # [T] True: input is the row's last sampled token
        self.src_rows = Twin(t, torch.int64, d)  # [T] persistent row of each token's request
        self.positions = Twin(t, torch.int64, d)  # [T]
        self.slot_mapping = Twin(t, torch.int64, d, fill=-1)  # [T] -1 = do not write
        self.block_tables = Twin((s, max_blocks_per_seq), torch.int32, d)  # [B, max_blocks]
        self._own = (self.input_ids, self.use_last, self.src_rows, self.positions, self.slot_mapping,
                     self.block_tables)
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        self.small = TwinGroup(d, [  # in the order of the assignment below
            TwinSpec(s, i32),  # seq_lens [B]
            TwinSpec(s + 1, i32),  # query_start_loc [B + 1]
            TwinSpec(s, i64),  # logits_indices [N]: token index of each sampled row
            TwinSpec(s, i64),  # sample_rows [N]: persistent row receiving the sample
            TwinSpec(s, f32),  # temperature [N]
            TwinSpec(s, i64),  # top_k [N]
            TwinSpec(s, f32, 1.0),  # top_p [N]
            TwinSpec(s, i64),  # seeds [N]
            TwinSpec(s, i64),  # sample_positions [N]: position of the sampled token
            # the logits processors' per-row parameters [N] (logits_processors.ProcessorParams),
            # written only by steps where some row uses a processor
            TwinSpec(s, f32),  # min_p
            TwinSpec(s, f32),  # presence_penalty
            TwinSpec(s, f32),  # frequency_penalty
            TwinSpec(s, f32, 1.0),  # repetition_penalty
            TwinSpec(s, i64),  # min_pos: the min_tokens stop ids are masked before it
        ])
        (self.seq_lens, self.query_start_loc, self.logits_indices, self.sample_rows, self.temperature,
         self.top_k, self.top_p, self.seeds, self.sample_positions, self.min_p, self.presence,
         self.frequency, self.repetition, self.min_pos) = self.small.twins

    def use_host(self, i: int) -> None:
        """Selects host set i % 2 of every buffer (CUDA; a no-op on CPU, where one set is the device)."""
        for twin in self._own:
            twin.use_host(i)
        self.small.use_host(i)

    def pad(self, num_reqs: int, num_tokens: int, num_sample: int, reqs_to: int, tokens_to: int) -> None:
        """Makes tokens num_tokens..tokens_to harmless (no request, written nowhere), requests
        num_reqs..reqs_to empty (seq_len 0, no tokens) and sample rows num_sample..reqs_to
        read token 0 and sample into the scratch row max_num_seqs (counts, last token)."""
        self.input_ids.np[num_tokens:tokens_to] = 0
        self.use_last.np[num_tokens:tokens_to] = False
        self.positions.np[num_tokens:tokens_to] = 0
        self.slot_mapping.np[num_tokens:tokens_to] = -1
        self.seq_lens.np[num_reqs:reqs_to] = 0
        self.block_tables.np[num_reqs:reqs_to] = 0
        self.query_start_loc.np[num_reqs + 1:reqs_to + 1] = self.query_start_loc.np[num_reqs]
        self.logits_indices.np[num_sample:reqs_to] = 0
        self.sample_rows.np[num_sample:reqs_to] = self.max_num_seqs

    def copy_to_device(self, num_reqs: int, num_tokens: int) -> None:
        """Enqueues (non-blocking) the copy of what a step of num_reqs requests and num_tokens
        tokens reads: the first rows of the per-token buffers and block tables, `small` whole."""
        for twin in (self.input_ids, self.use_last, self.src_rows, self.positions, self.slot_mapping):
            twin.copy_to_device(num_tokens)
        self.block_tables.copy_to_device(num_reqs)
        self.small.copy_to_device()

    def input_tokens(self, last_sampled: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """[T] int64 device: the known token, or the row's last sampled token where use_last.
        last_sampled: [max_num_seqs + 1] int64 device (InputBatch.last_sampled_gpu)."""
        last = last_sampled[self.src_rows.gpu[:num_tokens]]
        return torch.where(self.use_last.gpu[:num_tokens], last, self.input_ids.gpu[:num_tokens])
