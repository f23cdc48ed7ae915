"""An engine for the one-validation property test: what the API admits is planned by the real
scheduler core, encoded and decoded by the real plan codec, checked by the executor's real plan
checks and added to its real per-request rows. Anything that raises there is a 500 (the test
fails); what passes is answered with one finished output."""

from __future__ import annotations

import torch

from executor_svc.sample.rows import SamplingRows
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.plan_checks import check_plan
from protos.llmserve.executor.v1 import executor_pb2 as xpb
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.samples import sample_requests
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.messages import CoreStats
from step_protocol import codec
from step_protocol.domain import ExecutorInfo
from tests.scheduler.sched_driver import LetterDetokenizer

INFO = ExecutorInfo(model_name="tiny", model_path="", vocab_size=512, eos_token_ids=(2,),
                    max_model_len=256, block_size=16, num_blocks=129, cuda_graph_sizes=(),
                    max_num_seqs=256, max_num_batched_tokens=8192, device="cpu", dtype="float32",
                    max_logprobs=20, max_logit_bias=300, max_min_tokens_stop_ids=64)


class CheckingEngine:
    """EngineClient's surface for Admission and the servicers (info, stats, num_requests,
    generate) over the scheduler core, the plan codec and the executor's checks."""

    def __init__(self, info: ExecutorInfo = INFO):
        self.info = info
        self.stats = CoreStats()
        self.num_requests = 0
        self.core_lost = None
        self.num_ran = 0  # requests that crossed to the executor's rows
        self._next_id = 1

    async def generate(self, prompt_ids: list[int], params):
        self._run_on_executor(prompt_ids, params)
        self.num_ran += 1
        for i in range(params.n):
            yield RequestOutput(self._next_id + i, [], "", FinishReason.LENGTH, "", len(prompt_ids), 0,
                                index=i)
        self._next_id += params.n

    def _run_on_executor(self, prompt_ids: list[int], params) -> None:
        info = self.info
        config = SchedulerCoreConfig(
            num_blocks=info.num_blocks, block_size=info.block_size, max_num_seqs=info.max_num_seqs,
            max_num_batched_tokens=info.max_num_batched_tokens, max_model_len=info.max_model_len,
            long_prefill_token_threshold=0, eos_token_ids=tuple(info.eos_token_ids),
            enable_prefix_caching=False)
        scheduler = Scheduler(config, lambda request: LetterDetokenizer(), clock=lambda: 0.0)
        for request in sample_requests(self._next_id, list(prompt_ids), params):
            scheduler.add_request(request)
        plan = scheduler.schedule()
        wire = xpb.StepPlan.FromString(codec.plan_to_pb(plan).SerializeToString())
        decoded = codec.plan_from_pb(wire)
        max_blocks = info.max_model_len // info.block_size
        batch = InputBatch(info.max_num_seqs, max_blocks)
        sampling = SamplingRows(info.max_num_seqs, info.vocab_size, info.max_logit_bias,
                                info.max_min_tokens_stop_ids, torch.device("cpu"))
        checked = check_plan(decoded, batch, sampling, info)
        refused = getattr(checked, "refused", None)  # rows the executor would fail alone
        assert not refused, f"the executor refuses rows of an admitted request: {refused}"
        assert len(decoded.new_requests) == params.n, "every sample is scheduled in one plan"
        for new in decoded.new_requests:
            sampling.add(batch.add(new).row, new)
