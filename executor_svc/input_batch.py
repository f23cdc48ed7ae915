"""Per-request rows that persist across steps, and the static step buffers (host + device twins)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from executor_svc.plan import NewRequest


@dataclass
class RequestState:
    """What the executor remembers of one running request."""

    req_id: int
    row: int  # row in the persistent tables (block table, sampling params, last sampled)
    token_ids: list[int]  # tokens the scheduler sent (prompt + pre-preemption output)
    num_blocks: int
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)  # sampled here, for observability


class Twin:
    """A host buffer and its device twin (the same tensor on CPU). Host side pinned on CUDA.

    On CUDA the host side is double-buffered: `use_host(i)` selects set i % 2, so the next
    step can be prepared on the host while the previous step's non-blocking copies out of the
    other set may still be pending. The device twin stays single (stream order protects it).
    """

    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill=0):
        pin = device.type == "cuda"
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.hosts = [torch.full(shape, fill, dtype=dtype, pin_memory=pin) for _ in range(2 if pin else 1)]
        self.nps = [h.numpy() for h in self.hosts]  # fast host writes
        self.cpu, self.np = self.hosts[0], self.nps[0]
        self.gpu = torch.full(shape, fill, dtype=dtype, device=device) if pin else self.cpu

    def use_host(self, i: int) -> None:
        """Selects host set i (mod the number of sets) as `.cpu` / `.np`."""
        i %= len(self.hosts)
        self.cpu, self.np = self.hosts[i], self.nps[i]

    def copy_to_device(self, n: int) -> torch.Tensor:
        """Copies the first n rows (non-blocking) and returns the device view of them."""
        if self.gpu is not self.cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class InputBatch:
    """Persistent per-request rows: block table, sampling params, last sampled token (on device)."""

    def __init__(self, max_num_seqs: int, max_blocks_per_seq: int, device: torch.device):
        self.max_num_seqs, self.max_blocks_per_seq = max_num_seqs, max_blocks_per_seq
        self.requests: dict[int, RequestState] = {}
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.block_table = torch.zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.int32).numpy()
        self.temperature = torch.zeros(max_num_seqs, dtype=torch.float32).numpy()
        self.top_k = torch.zeros(max_num_seqs, dtype=torch.int64).numpy()
        self.top_p = torch.ones(max_num_seqs, dtype=torch.float32).numpy()
        self.seed = torch.zeros(max_num_seqs, dtype=torch.int64).numpy()
        # [max_num_seqs + 1] int64; the extra row is scratch for padded rows of a graph
        self.last_sampled_gpu = torch.zeros(max_num_seqs + 1, dtype=torch.int64, device=device)

    def add(self, new: NewRequest) -> RequestState:
        if new.req_id in self.requests:
            raise ValueError(f"request {new.req_id} is already running")
        if not self.free_rows:
            raise ValueError(f"more than max_num_seqs={self.max_num_seqs} running requests")
        row = self.free_rows.pop()
        state = RequestState(new.req_id, row, list(new.token_ids), 0, new.num_computed_tokens)
        self.requests[new.req_id] = state
        self.block_table[row] = 0
        self.append_blocks(state, new.block_ids)
        s = new.sampling
        self.temperature[row], self.top_k[row], self.top_p[row] = s.temperature, s.top_k, s.top_p
        self.seed[row] = s.seed & 0x7FFFFFFFFFFFFFFF
        return state

    def append_blocks(self, state: RequestState, block_ids: list[int]) -> None:
        end = state.num_blocks + len(block_ids)
        if end > self.max_blocks_per_seq:
            raise ValueError(f"request {state.req_id}: {end} blocks > max {self.max_blocks_per_seq}")
        self.block_table[state.row, state.num_blocks:end] = block_ids
        state.num_blocks = end

    def remove(self, req_id: int) -> None:
        """Forgets a request (finished, aborted or preempted); unknown ids are ignored."""
        state = self.requests.pop(req_id, None)
        if state is not None:
            self.block_table[state.row] = 0
            self.free_rows.append(state.row)

    def clear(self) -> None:
        for req_id in list(self.requests):
            self.remove(req_id)


class StepBuffers:
    """Static inputs of one step, allocated once at the largest size; a step fills the first rows."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int, max_blocks_per_seq: int,
                 device: torch.device):
        t, s, d = max_num_tokens, max_num_seqs, device
        self.input_ids = Twin(t, torch.int64, d)  # [T] known input tokens
        self.use_last = Twin(t, torch.bool, d)  # [T] True: input is the row's last sampled token
        self.src_rows = Twin(t, torch.int64, d)  # [T] persistent row of each token's request
        self.positions = Twin(t, torch.int64, d)  # [T]
        self.slot_mapping = Twin(t, torch.int64, d, fill=-1)  # [T] -1 = do not write
        self.seq_lens = Twin(s, torch.int32, d)  # [B]
        self.query_start_loc = Twin(s + 1, torch.int32, d)  # [B + 1]
        self.block_tables = Twin((s, max_blocks_per_seq), torch.int32, d)  # [B, max_blocks]
        self.logits_indices = Twin(s, torch.int64, d)  # [N] token index of each sampled row
        self.sample_rows = Twin(s, torch.int64, d)  # [N] persistent row receiving the sample
        self.temperature = Twin(s, torch.float32, d)  # [N]
        self.top_k = Twin(s, torch.int64, d)  # [N]
        self.top_p = Twin(s, torch.float32, d, fill=1.0)  # [N]
        self.seeds = Twin(s, torch.int64, d)  # [N]
        self.sample_positions = Twin(s, torch.int64, d)  # [N] position of the sampled token

    def twins(self) -> list[Twin]:
        return [v for v in vars(self).values() if isinstance(v, Twin)]

    def use_host(self, i: int) -> None:
        """Selects host set i % 2 of every buffer (CUDA; a no-op on CPU, where one set is the device)."""
        for twin in self.twins():
            twin.use_host(i)

    def pad(self, num_reqs: int, num_tokens: int, size: int) -> None:
        """Makes rows num_reqs..size (and tokens num_tokens..size) harmless padded rows."""
        self.input_ids.np[num_tokens:size] = 0
        self.use_last.np[num_tokens:size] = False
        self.positions.np[num_tokens:size] = 0
        self.slot_mapping.np[num_tokens:size] = -1
        self.seq_lens.np[num_reqs:size] = 0
        self.block_tables.np[num_reqs:size] = 0
        self.query_start_loc.np[num_reqs + 1:size + 1] = self.query_start_loc.np[num_reqs]
