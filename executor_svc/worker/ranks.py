"""How a step meets the other devices that run it: the interface the ModelRunner calls at fixed
points of a step, and its one-device implementation. Tensor parallelism plugs in here
(parallel/ranks.py: TensorParallelRanks) — the runner has no subclass and no private hook.

The points, in a step's order:
  guard()              around a launch / reset / use_graphs: rank 0 keeps a command and its
                       step's collectives together;
  admit(...)           gives back rejected drafts' slots, then checks and applies the plan
                       (rank 0 also sends the plan that runs, and the slots it gave back, to
                       the other ranks, which give back and apply the same);
  decides              this rank samples and verifies (rank 0; the only one alone);
  alone                no other rank: a constrained step's sampling may be enqueued after
                       its launch (model_runner._flush), outside the launch's guard;
  share_last_tokens()  after the step's last tokens are final: every rank holds the deciding
                       rank's (a broadcast on the device);
  reset(), use_graphs()  tell the other ranks; watch(), close(): their lifetime.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from executor_svc.worker.plan_apply import Admitted
from step_protocol.domain import StepPlan


class OneDevice:
    """The step runs on this device alone."""

    decides = True
    alone = True

    def guard(self) -> AbstractContextManager:
        return nullcontext()

    def admit(self, plan: StepPlan, own: list[tuple[int, int]],
              apply: Callable[[StepPlan, list[tuple[int, int]]], Admitted]) -> Admitted:
        """own: the (row, slots) this rank's finished verify steps reject; apply(plan, given):
        gives back `given`, then checks and applies the plan (plan_apply.admit)."""
        return apply(plan, own)

    def share_last_tokens(self, last_tokens: torch.Tensor) -> None:
        pass

    def reset(self) -> None:
        pass

    def use_graphs(self, enabled: bool) -> None:
        pass

    def watch(self, on_failure: Callable[[str], None]) -> None:
        pass

    def close(self, timeout: float = 10.0) -> None:
        pass
