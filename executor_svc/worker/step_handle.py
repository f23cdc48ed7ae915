"""What a launched step carries until its finish (StepHandle), and a step's host-side inputs
(Prepared): the ModelRunner's (model_runner.py) records."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from executor_svc.sample.inputs import SampleStep
from executor_svc.sample.logprobs import PendingPromptLogprobs, PromptLogprobRows
from executor_svc.sample.sampler import Sampled
from executor_svc.spec_decode.verify import VerifyOutcome, VerifyRows
from executor_svc.worker.step_inputs import PreparedStep
from executor_svc.worker.step_timer import StepTimer
from step_protocol.domain import StepResult


@dataclass
class StepHandle:
    """A launched step: what finish() needs to turn it into its StepResult."""

    out: StepResult  # step_id, prepare_us, graph_size set by launch(); the rest by finish()
    req_ids: list[int] = field(default_factory=list)  # requests that sample, in plan order
    timer: StepTimer | None = None  # CUDA: its last event marks the step's completion
    prev_end: torch.cuda.Event | None = None  # the previous step's completion (device idle)
    sampled: Sampled | None = None  # None: nothing sampled here (or another rank decides)
    prompt_logprobs: PendingPromptLogprobs | None = None
    verify: tuple[VerifyRows, VerifyOutcome] | None = None  # speculative decoding's verify rows
    deferred: tuple[torch.Tensor, SampleStep, int] | None = None  # a constrained step's sampling, not enqueued yet
    flushed: threading.Event | None = None  # a deferred step's: set once its sampling is enqueued
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def step_id(self) -> int:
        return self.out.step_id


class Prepared(NamedTuple):
    """A step's inputs, written on the host (ModelRunner._prepare)."""

    step: PreparedStep
    sampling: SampleStep
    prompt_rows: PromptLogprobRows | None
    spec: VerifyRows | None
