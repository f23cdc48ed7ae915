"""PlanChannel: rank 0 tells the other ranks what to run, over the gloo `cpu_group`: a header
int64 [op, payload bytes, arg] broadcast, then the payload (a step plan encoded by
step_protocol's codec) as uint8. The other ranks block in receive() between steps."""

from __future__ import annotations

import torch

from executor_svc.parallel.state import TensorParallel

LAUNCH, RESET, STOP, USE_GRAPHS = 1, 2, 3, 4


class PlanChannel:
    def __init__(self, tp: TensorParallel):
        self.tp = tp

    def send(self, op: int, payload: bytes = b"", arg: int = 0) -> None:
        """Rank 0: one command to every other rank."""
        import torch.distributed as dist

        dist.broadcast(torch.tensor([op, len(payload), arg], dtype=torch.int64), src=0, group=self.tp.cpu_group)
        if payload:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            dist.broadcast(data, src=0, group=self.tp.cpu_group)

    def receive(self) -> tuple[int, bytes, int]:
        """Ranks 1..: the next command (op, payload, arg)."""
        import torch.distributed as dist

        header = torch.zeros(3, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.tp.cpu_group)
        op, size, arg = header.tolist()
        if not size:
            return op, b"", arg
        data = torch.empty(size, dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self.tp.cpu_group)
        return op, data.numpy().tobytes(), arg
