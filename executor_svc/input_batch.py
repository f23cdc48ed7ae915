"""Per-request rows that persist across steps, and the static step buffers (host + device twins)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from executor_svc.plan import NewRequest


@dataclass
class RequestState:
    """What the executor remembers of one running request (its counters live in InputBatch rows)."""

    req_id: int
    row: int  # row in the persistent tables (block table, counters, sampling params, last sampled)
    token_ids: np.ndarray  # [num_known] int64: tokens the scheduler sent (prompt + pre-preemption output)
    output_token_ids: list[int] = field(default_factory=list)  # sampled here, for observability


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


class TwinGroup:
    """Small 1-D twins packed into one byte buffer per host set (and one on the device), so a
    step copies all of them with one non-blocking copy. Members are contiguous views at fixed
    64-byte aligned offsets (stable device addresses, as the graphs need)."""

    ALIGN = 64

    def __init__(self, device: torch.device, specs: dict[str, tuple[int, torch.dtype, float]]):
        pin = device.type == "cuda"
        offsets, total = {}, 0
        for name, (size, dtype, _) in specs.items():
            offsets[name] = total
            nbytes = size * torch.empty((), dtype=dtype).element_size()
            total += -(-nbytes // self.ALIGN) * self.ALIGN
        self.hosts = [torch.zeros(total, dtype=torch.uint8, pin_memory=pin) for _ in range(2 if pin else 1)]
        self.gpu = torch.zeros(total, dtype=torch.uint8, device=device) if pin else self.hosts[0]
        self.cpu = self.hosts[0]
        self.twins: dict[str, Twin] = {}
        for name, (size, dtype, fill) in specs.items():
            nbytes = size * torch.empty((), dtype=dtype).element_size()
            hosts = [h[offsets[name]:offsets[name] + nbytes].view(dtype) for h in self.hosts]
            gpu = self.gpu[offsets[name]:offsets[name] + nbytes].view(dtype) if pin else hosts[0]
            self.twins[name] = Twin(size, dtype, device, fill, views=(hosts, gpu))

    def use_host(self, i: int) -> None:
        self.cpu = self.hosts[i % len(self.hosts)]
        for twin in self.twins.values():
            twin.use_host(i)

    def copy_to_device(self) -> None:
        """Copies the whole group (every member, all rows) in one non-blocking copy."""
        if self.gpu is not self.cpu:
            self.gpu.copy_(self.cpu, non_blocking=True)


class InputBatch:
    """Persistent per-request rows: block table, counters, sampling params, last sampled token
    (on device). The per-row numpy arrays let a step be prepared with whole-array operations."""

    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device):
        s = max_num_seqs
        self.max_num_seqs, self.max_blocks_per_seq = max_num_seqs, max_blocks_per_seq
        self.requests: dict[int, RequestState] = {}
        self.states: list[RequestState | None] = [None] * s  # by row
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.block_table = np.zeros((s, max_blocks_per_seq), dtype=np.int32)
        self.num_blocks = np.zeros(s, dtype=np.int64)  # blocks in the row's table
        self.num_computed = np.zeros(s, dtype=np.int64)  # tokens whose KV is computed (or enqueued)
        self.num_known = np.zeros(s, dtype=np.int64)  # len(token_ids): tokens the scheduler sent
        self.temperature = np.zeros(s, dtype=np.float32)
        self.top_k = np.zeros(s, dtype=np.int64)
        self.top_p = np.ones(s, dtype=np.float32)
        self.seed = np.zeros(s, dtype=np.int64)
        # [max_num_seqs + 1] int64; the extra row is scratch for padded rows of a graph
        self.last_sampled_gpu = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=device)

    def add(self, new: NewRequest) -> RequestState:
        if new.req_id in self.requests:
            raise ValueError(f"request {new.req_id} is already running")
        if not self.free_rows:
            raise ValueError(f"more than max_num_seqs={self.max_num_seqs} running requests")
        row = self.free_rows.pop()
        state = RequestState(new.req_id, row, np.asarray(new.token_ids, dtype=np.int64).reshape(-1))
        self.requests[new.req_id] = state
        self.states[row] = state
        self.block_table[row] = 0
        self.num_blocks[row] = 0
        self.num_computed[row] = new.num_computed_tokens
        self.num_known[row] = len(state.token_ids)
        s = new.sampling
        self.temperature[row], self.top_k[row], self.top_p[row] = s.temperature, s.top_k, s.top_p
        self.seed[row] = s.seed & 0x7FFFFFFFFFFFFFFF
        try:
            self.append_blocks(state, new.block_ids)
        except ValueError:
            self.remove(new.req_id)
            raise
        return state

    def append_blocks(self, state: RequestState, block_ids: list[int]) -> None:
        if not block_ids:
            return
        row = state.row
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        if end > self.max_blocks_per_seq:
            raise ValueError(f"request {state.req_id}: {end} blocks > max {self.max_blocks_per_seq}")
        self.block_table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def remove(self, req_id: int) -> None:
        """Forgets a request (finished, aborted or preempted); unknown ids are ignored."""
        state = self.requests.pop(req_id, None)
        if state is not None:
            self.block_table[state.row] = 0
            self.num_blocks[state.row] = 0
            self.states[state.row] = None
            self.free_rows.append(state.row)

    def clear(self) -> None:
        for req_id in list(self.requests):
            self.remove(req_id)


class StepBuffers:
    """Static inputs of one step, allocated once at the largest size; a step fills the first rows.

    Per-token buffers and the block tables are copied row-prefix by row-prefix; the small
    per-request and per-sample buffers live in one TwinGroup (`small`), copied whole at once."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 device: torch.device):
        t, s, d = max_num_tokens, max_num_seqs, device
        self.input_ids = Twin(t, torch.int64, d)  # [T] known input tokens
        self.use_last = Twin(t, torch.bool, d)  # [T] True: input is the row's last sampled token
        self.src_rows = Twin(t, torch.int64, d)  # [T] persistent row of each token's request
        self.positions = Twin(t, torch.int64, d)  # [T]
        self.slot_mapping = Twin(t, torch.int64, d, fill=-1)  # [T] -1 = do not write
        self.block_tables = Twin((s, max_blocks_per_seq), torch.int32, d)  # [B, max_blocks]
        i32, i64, f32 = torch.int32, torch.int64, torch.float32
        self.small = TwinGroup(d, {
            "seq_lens": (s, i32, 0),  # [B]
            "query_start_loc": (s + 1, i32, 0),  # [B + 1]
            "logits_indices": (s, i64, 0),  # [N] token index of each sampled row
            "sample_rows": (s, i64, 0),  # [N] persistent row receiving the sample
            "temperature": (s, f32, 0),  # [N]
            "top_k": (s, i64, 0),  # [N]
            "top_p": (s, f32, 1.0),  # [N]
            "seeds": (s, i64, 0),  # [N]
            "sample_positions": (s, i64, 0),  # [N] position of the sampled token
        })
        for name, twin in self.small.twins.items():
            setattr(self, name, twin)

    def twins(self) -> list[Twin]:
        return [v for v in vars(self).values() if isinstance(v, Twin)]

    def use_host(self, i: int) -> None:
        """Selects host set i % 2 of every buffer (CUDA; a no-op on CPU, where one set is the device)."""
        for twin in self.twins():
            twin.use_host(i)
        self.small.use_host(i)

    def pad(self, num_reqs: int, num_tokens: int, size: int) -> None:
        """Makes rows num_reqs..size (and tokens num_tokens..size) harmless padded rows."""
        self.input_ids.np[num_tokens:size] = 0
        self.use_last.np[num_tokens:size] = False
        self.positions.np[num_tokens:size] = 0
        self.slot_mapping.np[num_tokens:size] = -1
        self.seq_lens.np[num_reqs:size] = 0
        self.block_tables.np[num_reqs:size] = 0
        self.query_start_loc.np[num_reqs + 1:size + 1] = self.query_start_loc.np[num_reqs]
