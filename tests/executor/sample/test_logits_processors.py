"""Logits processors and logprobs through the real runner, against plain-torch references
applied to transformers' logits on the same weights (fp32), eager and on the graph path."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from executor_svc.sample.graphs import SamplerGraphs
from executor_svc.sample.sampler import Sampler
from executor_svc.worker.model_runner import ModelRunner
from kernels.reference import gumbel_sample_reference
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import cached_rows, decode_rows, make_runner
from tests.executor.worker.test_graph_padding import EagerGraphs

ARCH = "tiny-llama"
PROMPTS = {1: [5, 17, 17, 99, 3, 250, 17, 8], 2: list(range(30, 52)), 3: [400, 2, 2, 2, 9, 77],
           4: [11, 12, 13, 14, 15, 16, 17]}
NUM_STEPS = 10


class EagerSamplerGraphs(SamplerGraphs):
    """Captures nothing; a 'replay' runs what the graph records, eagerly, on the same buffers."""

    def _capture(self, pool):
        pass

    def _replay(self, kind, size):
        self._runs[kind](size)


def graph_runner(path) -> ModelRunner:
    """A CPU runner whose decode and sampler 'graphs' run eagerly over the static buffers."""
    base = make_runner(path)
    last = base.sampler.last_tokens
    graphs = EagerGraphs(base.model, base.buffers, base.kv_caches, last, (1, 2, 4, 8), base.limits.max_model_len)
    rows, inputs = base.sampler.rows, base.sampler.inputs
    sampler_graphs = EagerSamplerGraphs(graphs.logits, last, inputs, rows.tables, graphs.sizes,
                                        base.info().max_logprobs, None)
    info = dataclasses.replace(base.info(), cuda_graph_sizes=tuple(graphs.sizes))
    return ModelRunner(base.model, base.kv_caches, base.batch, base.buffers,
                       Sampler(rows, inputs, last, sampler_graphs), base.limits, info, graphs)


def reference_processed(logits: torch.Tensor, s: SamplerParams, prompt: list[int],
                        generated: list[int]) -> torch.Tensor:
    """vLLM's processors, one row, written plainly: bias, min_tokens, repetition, frequency and
    presence, min_p."""
    x = logits.clone().float()
    for token, bias in s.logit_bias:
        x[token] += bias
    if len(generated) < s.min_tokens:
        for token in s.min_tokens_stop_ids:
            x[token] = float("-inf")
    counts = torch.bincount(torch.tensor(generated, dtype=torch.int64), minlength=x.shape[0]).float()
    if s.repetition_penalty != 1.0:
        for token in set(prompt) | set(generated):
            x[token] = x[token] / s.repetition_penalty if x[token] > 0 else x[token] * s.repetition_penalty
    x = x - s.frequency_penalty * counts - s.presence_penalty * (counts > 0).float()
    if s.min_p > 0 and s.temperature > 0:
        probs = torch.softmax(x / s.temperature, dim=-1)
        x[probs < s.min_p * probs.max()] = float("-inf")
    return x


def hf_last_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0, -1].float()


def reference_tokens(hf_model, prompt: list[int], s: SamplerParams, num: int) -> list[int]:
    generated: list[int] = []
    for _ in range(num):
        x = reference_processed(hf_last_logits(hf_model, prompt + generated), s, prompt, generated)
        position = torch.tensor([len(prompt) + len(generated)])
        token = gumbel_sample_reference(x[None], torch.tensor([s.temperature]),
                                        torch.tensor([s.seed]), position)
        generated.append(int(token[0]))
    return generated


PARAMS = {
    1: SamplerParams(repetition_penalty=1.8, presence_penalty=0.7, frequency_penalty=0.4),
    2: SamplerParams(temperature=0.9, seed=7, min_p=0.2, logit_bias=((40, 3.0), (41, -100.0), (7, 2.5))),
    3: SamplerParams(min_tokens=6, min_tokens_stop_ids=()),  # set below: the greedy path's own tokens
    4: SamplerParams(),  # no processor: must sample exactly what the plain path samples
}


def run(runner: ModelRunner, params: dict[int, SamplerParams], steps: int = NUM_STEPS):
    new = [NewRequestData(r, PROMPTS[r], params[r], [4 * r + i for i in range(1, 5)], 0, len(PROMPTS[r]))
           for r in params]
    outs = [runner.execute(StepPlan(1, new))]
    for step in range(2, steps + 1):
        outs.append(runner.execute(StepPlan(step, [], decode_rows(list(params)))))
    got = {r: [] for r in params}
    for out in outs:
        for r, t in out.sampled().items():
            got[r].append(t)
    return got, outs


def _params_with_min_tokens(hf_model) -> dict[int, SamplerParams]:
    """Request 3 masks the first tokens plain greedy would produce, so min_tokens must change them."""
    plain = reference_tokens(hf_model, PROMPTS[3], SamplerParams(), 6)
    return {**PARAMS, 3: SamplerParams(min_tokens=4, min_tokens_stop_ids=tuple(sorted(set(plain[:3]))))}


@pytest.mark.parametrize("graphs", [False, True])
def test_processors_match_reference_on_transformers_logits(model_dirs, hf_models, graphs):
    hf = hf_models[ARCH]
    params = _params_with_min_tokens(hf)
    runner = graph_runner(model_dirs[ARCH]) if graphs else make_runner(model_dirs[ARCH])
    got, outs = run(runner, params)
    if graphs:
        assert all(o.graph_size == 4 for o in outs[1:])
    for r, s in params.items():
        assert got[r] == reference_tokens(hf, PROMPTS[r], s, NUM_STEPS), r
    # each processor changed something (the test can fail): not the plain greedy/sampled tokens
    for r in (1, 2, 3):
        plain = dataclasses.replace(SamplerParams(), temperature=params[r].temperature, seed=params[r].seed)
        assert got[r] != reference_tokens(hf, PROMPTS[r], plain, NUM_STEPS), r


def test_penalty_counts_survive_preemption(model_dirs, hf_models):
    """A preempted request comes back with its generated tokens: counts are rebuilt from them."""
    s = PARAMS[1]
    prompt = PROMPTS[1]
    runner = make_runner(model_dirs[ARCH])
    blocks = [1, 2, 3, 4]
    got = runner.execute(StepPlan(1, [NewRequestData(1, prompt, s, blocks, 0, len(prompt))])).token_ids
    for step in range(2, 5):
        got += runner.execute(StepPlan(step, [], decode_rows([1]))).token_ids
    known = prompt + got
    back = NewRequestData(1, known, s, blocks, 0, len(known), num_prompt_tokens=len(prompt))
    got += runner.execute(StepPlan(5, [back], preempted_req_ids=[1])).token_ids
    for step in range(6, NUM_STEPS + 1):
        got += runner.execute(StepPlan(step, [], decode_rows([1]))).token_ids
    assert got == reference_tokens(hf_models[ARCH], prompt, s, NUM_STEPS)


@pytest.mark.parametrize("graphs", [False, True])
def test_logprobs_equal_log_softmax_of_transformers_logits(model_dirs, hf_models, graphs):
    hf = hf_models[ARCH]
    k = 5
    # request 2 also has processors: its logprobs stay raw (before bias and penalties)
    params = {1: SamplerParams(logprobs=k),
              2: SamplerParams(temperature=1.0, seed=3, logprobs=0, logit_bias=((40, 5.0),),
                               repetition_penalty=1.5),
              4: SamplerParams()}
    runner = graph_runner(model_dirs[ARCH]) if graphs else make_runner(model_dirs[ARCH])
    got, outs = run(runner, params, steps=6)
    for step, out in enumerate(outs):
        assert out.logprobs is not None and out.logprobs.num_top == k
        for i, r in enumerate(out.req_ids):
            if r == 4:
                continue
            token, lp, rank, top_ids, top_lps = out.logprobs.row(i)
            expected = torch.log_softmax(hf_last_logits(hf, PROMPTS[r] + got[r][:step]), dim=-1)
            assert token == got[r][step]
            assert lp == pytest.approx(float(expected[token]), abs=1e-4)
            assert rank == int((expected > expected[token]).sum()) + 1
            top = expected.topk(k)
            assert top_ids == top.indices.tolist()
            assert top_lps == pytest.approx(top.values.tolist(), abs=1e-4)


def test_no_logprobs_asked_means_none_returned(model_dirs):
    _, outs = run(make_runner(model_dirs[ARCH]), {4: SamplerParams()}, steps=3)
    assert all(o.logprobs is None and o.prompt_logprobs is None for o in outs)


def test_prompt_logprobs_across_chunks(model_dirs, hf_models):
    """Prompt logprobs of a prompt prefilled in two chunks (positions 1..L-1, each once)."""
    hf = hf_models[ARCH]
    prompt = PROMPTS[2]  # 22 tokens: chunks of 9 and 13
    k = 3
    runner = make_runner(model_dirs[ARCH])
    s = SamplerParams(prompt_logprobs=k)
    out1 = runner.execute(StepPlan(1, [NewRequestData(1, prompt, s, [1, 2], 0, 9)]))
    out2 = runner.execute(StepPlan(2, [], cached_rows((1, 13))))
    with torch.no_grad():
        expected = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    positions = []
    for out in (out1, out2):
        p = out.prompt_logprobs
        assert p is not None and p.req_ids == [1] and p.values.num_top == k
        first, count = p.first_positions[0], p.counts[0]
        for j in range(count):
            pos = first + j
            token, lp, rank, top_ids, top_lps = p.values.row(j)
            assert token == prompt[pos]
            assert lp == pytest.approx(float(expected[pos - 1, token]), abs=1e-4)
            assert rank == int((expected[pos - 1] > expected[pos - 1, token]).sum()) + 1
            assert top_ids == expected[pos - 1].topk(k).indices.tolist()
            assert top_lps == pytest.approx(expected[pos - 1].topk(k).values.tolist(), abs=1e-4)
            positions.append(pos)
    assert positions == list(range(1, len(prompt)))


SINGLE = {
    "presence_penalty": SamplerParams(presence_penalty=1.5),
    "frequency_penalty": SamplerParams(frequency_penalty=0.8),
    "repetition_penalty": SamplerParams(repetition_penalty=2.0),
    "negative_repetition_penalty_side": SamplerParams(repetition_penalty=0.5),
    "logit_bias": SamplerParams(logit_bias=((250, 4.0), (17, -100.0))),
    "min_p": SamplerParams(temperature=1.5, seed=11, min_p=0.3),
}


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_each_processor_alone_matches_reference(model_dirs, hf_models, name):
    hf, s = hf_models[ARCH], SINGLE[name]
    got, _ = run(make_runner(model_dirs[ARCH]), {1: s})
    assert got[1] == reference_tokens(hf, PROMPTS[1], s, NUM_STEPS)
    plain = SamplerParams(temperature=s.temperature, seed=s.seed)
    assert got[1] != reference_tokens(hf, PROMPTS[1], plain, NUM_STEPS), "the processor changed nothing"


def _row_reuse_tokens(runner: ModelRunner, first: SamplerParams | None, params: SamplerParams,
                      steps: int = 12) -> list[int]:
    """Request 2's tokens when it gets the row `first` (request 1) just left (None: it runs
    alone), while request 3, with a penalty (the processors run for the whole step), is in the
    batch for its steps 4-8."""
    prompt = PROMPTS[2]
    if first is not None:
        runner.execute(StepPlan(1, [NewRequestData(1, PROMPTS[1], first, [30, 31], 0, len(PROMPTS[1]))]))
        row = runner.batch.requests[1].row
    out = runner.execute(StepPlan(2, [NewRequestData(2, prompt, params, [1, 2, 3], 0, len(prompt))],
                                  finished_req_ids=[1] if first is not None else []))
    if first is not None:
        assert runner.batch.requests[2].row == row  # the row and its tables were request 1's
    got = [out.sampled()[2]]
    penalty = SamplerParams(presence_penalty=0.5)
    for step in range(3, steps + 2):
        new = [NewRequestData(3, PROMPTS[3], penalty, [40], 0, len(PROMPTS[3]))] if step == 4 else []
        ids = [2, 3] if 4 < step <= 8 else [2]
        out = runner.execute(StepPlan(step, new, decode_rows(ids), finished_req_ids=[3] if step == 9 else []))
        got.append(out.sampled()[2])
    return got


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("leak", ["logit_bias", "stop_ids"])
def test_reused_row_keeps_no_processor_tables_of_its_last_request(model_dirs, leak, graphs):
    """A request that uses no processor gets the row of one that did (a finished row is the
    next one given): when another row makes the step run the processors, the previous
    request's bias table (logit_bias 5: +100) or stop ids (masked while min_tokens, which a
    request with min_tokens but no stop ids also has) must not apply to it. Seeded: token-exact
    with running alone. (Found as a seeded gRPC stream turning to token 5 for 5 steps beside a
    hostile logit_bias request.)"""
    path = model_dirs[ARCH]
    make = (lambda: graph_runner(path)) if graphs else (lambda: make_runner(path))
    params = SamplerParams(temperature=0.9, seed=11, min_tokens=20 if leak == "stop_ids" else 0)
    alone = _row_reuse_tokens(make(), None, params)
    first = (SamplerParams(logit_bias=((5, 100.0),)) if leak == "logit_bias" else
             SamplerParams(min_tokens=30, min_tokens_stop_ids=tuple(sorted(set(alone)))))
    assert _row_reuse_tokens(make(), first, params) == alone
