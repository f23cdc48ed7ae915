"""The steady decode step (worker/steady.py): a plan that repeats the last step's rows, one
token each, writes only what moves; its tokens and every step buffer it hands the device equal
the general path's, step for step, and anything else (or a check that fails) takes the
general path, which refuses or fails rows as before. A third runner copies its inputs in the
CUDA layout (one packed copy, on the CPU): its steady steps write nothing on the host and move
the inputs on the "device" (kernels.decode_advance, the reference here; the Triton kernel is
tested against it in tests/kernels/test_decode_advance.py)."""

from __future__ import annotations

import numpy as np
import pytest

from executor_svc.worker.plan_checks import PlanError
from executor_svc.worker.step_buffers import StepBuffers
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import make_runner

BUFFERS = ("input_ids", "use_last", "src_rows", "positions", "slot_mapping", "seq_lens", "query_start_loc",
           "logits_indices", "block_tables")
SAMPLER_COLUMNS = ("rows", "positions", "temperature", "top_k", "top_p", "seeds")


from kernels import decode_advance as _advance  # noqa: E402 - the reference on CPU


@pytest.fixture(scope="module")
def runners(model_dirs):
    """(steady on, steady off, steady on with the CUDA layout's packed copy) over the same tiny model."""
    on, off, packed = (make_runner(model_dirs["tiny-llama"], block_size=4) for _ in range(3))
    off._steady.enabled = False
    b = packed.buffers
    packed.buffers = StepBuffers(b.max_num_seqs, b.max_num_tokens, packed.batch.max_blocks_per_seq, b.device, pack=True)
    return on, off, packed


class Scheduler:
    """Hands out a block when a request's next token needs one; records which path each step took."""

    def __init__(self, runners):
        self.runners, self.step_id, self.next_block = runners, 0, 1
        self.lens: dict[int, int] = {}  # req_id -> tokens computed after this step
        self.blocks: dict[int, int] = {}
        self.steady: list[bool] = []

    def new(self, req_id: int, prompt: list[int], params: SamplerParams) -> NewRequestData:
        n = -(-(len(prompt) + 1) // 4)
        ids = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        self.lens[req_id], self.blocks[req_id] = len(prompt), n
        return NewRequestData(req_id, prompt, params, ids, 0, len(prompt))

    def decode(self, req_ids: list[int], bad_block_for: int | None = None,
               no_block_for: int | None = None) -> CachedRequestData:
        """One token a row; a block to the rows that need one (id 10,000 for bad_block_for,
        none for no_block_for)."""
        data = CachedRequestData()
        for r in req_ids:
            new = []
            if self.lens[r] + 1 > self.blocks[r] * 4 and r != no_block_for:
                new = [10_000 if r == bad_block_for else self.next_block]
                self.next_block += 1
                self.blocks[r] += 1
            self.lens[r] += 1
            data.append(r, 1, new)
        return data

    def step(self, new=(), cached=None, finished=()) -> list:
        """Launches the plan on both runners (steady on / off); returns both results, checking
        that the device inputs of the two launches were equal."""
        self.step_id += 1
        outs = []
        for runner in self.runners:
            plan = StepPlan(self.step_id, list(new), cached or CachedRequestData(), list(finished), [])
            took = []
            apply = runner._apply
            runner._apply = lambda p, g, _a=apply: took.append(_a(p, g)) or took[-1]
            try:
                handle = runner.launch(plan)
            finally:
                del runner._apply
            outs.append(runner.finish(handle))
            if took:
                outs[-1].steady = took[-1].steady is not None
        on, off, packed = self.runners
        if outs[0].req_ids:  # the buffers each handed the device (CPU: the host arrays)
            b, t = len(outs[0].req_ids), len(outs[0].req_ids)
            for name in BUFFERS:
                rows = b + 1 if name == "query_start_loc" else (b if name in ("seq_lens", "logits_indices", "block_tables") else t)
                want = getattr(off.buffers, name).np[:rows]
                np.testing.assert_array_equal(getattr(on.buffers, name).np[:rows], want, err_msg=f"step {self.step_id}: {name}")
                np.testing.assert_array_equal(getattr(packed.buffers, name).gpu[:rows].numpy(), want,
                                              err_msg=f"step {self.step_id}: {name} (packed)")
            for name in SAMPLER_COLUMNS:  # the sampled rows' columns: a steady step moves the positions only
                np.testing.assert_array_equal(getattr(on.sampler.inputs, name).np[:b],
                                              getattr(off.sampler.inputs, name).np[:b], err_msg=f"step {self.step_id}: {name}")
        self.steady.append(getattr(outs[0], "steady", False))
        assert not getattr(outs[1], "steady", False) and getattr(outs[2], "steady", False) == self.steady[-1]
        assert outs[2].req_ids == outs[0].req_ids and outs[2].token_ids == outs[0].token_ids
        assert outs[2].failed_req_ids == outs[0].failed_req_ids
        return outs[:2]


def test_steady_steps_equal_the_general_path_token_for_token(runners, monkeypatch):
    import kernels

    advances = []
    monkeypatch.setattr(kernels, "decode_advance", lambda *a: advances.append(a[5].shape[1]) or _advance(*a))
    for runner in runners:
        runner.reset()
    s = Scheduler(runners)
    greedy, seeded = SamplerParams(), SamplerParams(temperature=1.0, top_k=20, seed=11)
    s.step(new=[s.new(1, list(range(3, 14)), greedy), s.new(2, [5, 9, 77, 12], seeded),
                s.new(3, list(range(40, 47)), greedy)])
    ids = [1, 2, 3]
    tokens = {r: [] for r in ids}
    for i in range(14):  # every row crosses into new blocks on the way (block size 4)
        on, off = s.step(cached=s.decode(ids))
        assert on.req_ids == off.req_ids == ids and on.token_ids == off.token_ids
        for r, t in zip(on.req_ids, on.token_ids):
            tokens[r].append(t)
        if i == 0:
            blocks_after_general = sum(s.blocks.values())
    # the first decode step follows a prefill: general; every later one repeats it
    assert s.steady == [False, False] + [True] * 13
    # the packed runner's 13 steady steps moved on the device, with every block the rows gained
    assert len(advances) == 13 and sum(advances) == sum(s.blocks.values()) - blocks_after_general > 6
    packed = runners[2].buffers  # and its host arrays wrote none of it (behind by 13 positions)
    np.testing.assert_array_equal(packed.positions.gpu[:3].numpy() - packed.positions.np[:3], [13] * 3)
    packed.packed.last = None  # the device holds another layout: the steady step is copied after all
    on, off = s.step(cached=s.decode(ids))  # (Scheduler.step compares what the packed runner's "device" holds)
    assert s.steady[-1] and len(advances) == 13 and on.token_ids == off.token_ids
    held = runners[0].sampler.inputs._held  # the steady steps kept the sampler's columns under their key
    assert runners[0]._steady.key is not None and held[0] is not None and held[0][0] == runners[0]._steady.key
    s.step(cached=s.decode([1, 3]))  # request 2 sits out (its last token in flight): general
    on, off = s.step(cached=s.decode([1, 3]), finished=[2])  # it finishes; the rows repeat: steady
    assert s.steady[-2:] == [False, True] and on.token_ids == off.token_ids
    assert all(2 not in r.batch.requests for r in runners)
    for runner in runners:  # a repeated row also finished, stray draft ids: the general path refuses
        with pytest.raises(PlanError, match="also finished"):
            runner.launch(StepPlan(s.step_id + 1, [], CachedRequestData.decode_rows([1, 3]), [1], []))
        with pytest.raises(PlanError, match="draft"):
            runner.launch(StepPlan(s.step_id + 1, [], CachedRequestData.decode_rows([1, 3]), draft_token_ids=[5]))
    s.step(cached=s.decode([3, 1]))  # another order: general
    s.step(new=[s.new(4, [8, 8, 8], greedy)], cached=s.decode([3, 1]))  # a new request: general
    on, off = s.step(cached=s.decode([3, 1, 4]))
    on, off = s.step(cached=s.decode([3, 1, 4]))
    assert s.steady[-4:] == [False, False, False, True] and on.token_ids == off.token_ids
    assert on.req_ids == [3, 1, 4]
    assert len(set(tokens[2])) > 1  # the seeded row really sampled


@pytest.mark.parametrize("fault", ["bad_block", "no_block"])
def test_a_repeat_that_fails_its_checks_takes_the_general_path(runners, fault):
    """A bad new block id, or a row whose token needs a block the plan does not give: the
    steady path refuses nothing itself; the general path fails that row alone, as before."""
    for runner in runners:
        runner.reset()
    s = Scheduler(runners)
    s.step(new=[s.new(1, [3, 4, 5, 6, 7, 8, 9], SamplerParams()), s.new(2, [9, 10, 11], SamplerParams())])
    s.step(cached=s.decode([1, 2]))
    while s.lens[2] + 1 <= s.blocks[2] * 4:  # steady until request 2 needs a block
        s.step(cached=s.decode([1, 2]))
    kw = {"bad_block_for": 2} if fault == "bad_block" else {"no_block_for": 2}
    on, off = s.step(cached=s.decode([1, 2], **kw))
    assert s.steady[-1] is False and on.failed_req_ids == off.failed_req_ids == [2]
    assert on.req_ids == off.req_ids == [1] and on.token_ids == off.token_ids


def test_a_last_one_token_prefill_chunk_is_not_repeated_as_a_decode_step(runners):
    """A step of one token a row where a row's token is its prompt's last (a chunked prefill's
    last chunk) samples every row but feeds that row a known token: the next step must not
    take its inputs for a decode step's."""
    for runner in runners:
        runner.reset()
    s = Scheduler(runners)
    s.step(new=[s.new(1, [3, 4, 5, 6, 7], SamplerParams())])
    prompt = [9, 10, 11, 12, 13]
    first = s.new(2, prompt, SamplerParams())
    first.num_scheduled_tokens, s.lens[2] = 4, 4  # its first chunk: 4 of 5 prompt tokens, no sample
    s.step(new=[first], cached=s.decode([1]))
    s.step(cached=s.decode([1, 2]))  # one token each: 1 decodes, 2 computes its last prompt token
    for _ in range(3):
        on, off = s.step(cached=s.decode([1, 2]))
        assert on.token_ids == off.token_ids
    assert s.steady[-4:] == [False, False, True, True]
