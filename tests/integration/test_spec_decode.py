"""Speculative decoding (n-gram proposer) end to end on tiny random models: the scheduler core
driving a real ModelRunner through the engine's step loop (benchmarks/inprocess.py's transport:
plans and results go through their protobuf form). Greedy outputs must be token-exact with
speculation off; proposals must be accepted on repetitive text and rejected elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.inprocess import InProcessTransport
from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.startup.build import build_runner
from llmserve.speculative import SpecDecodeConfig
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.engine.step_loop import StepLoop

SPEC = SpecDecodeConfig("ngram", num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2)


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    base = tmp_path_factory.mktemp("spec-models")
    out = {}
    for name in ("tiny-llama", "tiny-qwen3"):
        path = build_random_model(base / name, name)
        out[name] = build_runner(ExecutorConfig(
            model=str(path), device="cpu", dtype="float32", max_num_seqs=8,
            max_num_batched_tokens=64, num_kv_blocks=96, max_model_len=256, block_size=16))
    return out


def generate(runner, prompts, spec, *, depth=3, max_tokens=48, budget=64, temperature=0.0, plans=None,
             **params):
    """{req_id: token ids} and the scheduler (for its figures); plans: a list to which every
    plan is appended."""
    runner.reset()
    info = runner.info()
    core = SchedulerCoreConfig(
        num_blocks=info.num_blocks, block_size=info.block_size, max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=budget, max_model_len=info.max_model_len,
        eos_token_ids=tuple(info.eos_token_ids), speculative=spec)
    scheduler = Scheduler(core, clock=lambda: 0.0)  # no mode trials (core/spec/trials.py): deterministic
    for i, prompt in enumerate(prompts):
        scheduler.add_request(Request(i, list(prompt), SamplingParams(
            max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=i, **params)))
    tokens = {i: [] for i in range(len(prompts))}
    finish = {}

    def on_outputs(outputs, errors):
        assert not errors, errors
        for o in outputs:
            assert o.req_id not in finish, "output after the end"
            tokens[o.req_id] += o.new_token_ids
            assert o.num_output_tokens == len(tokens[o.req_id])
            if o.finish_reason is not None:
                finish[o.req_id] = o.finish_reason

    loop = StepLoop(scheduler, InProcessTransport(runner), depth, on_outputs,
                    on_plan=None if plans is None else plans.append)
    asyncio.run(loop.run_until_idle())
    assert set(finish) == set(tokens)
    assert scheduler.num_free_blocks == scheduler.num_total_blocks
    return tokens, scheduler


def prompts_for(vocab: int) -> list[list[int]]:
    motif = [5, 17, 42, 9, 33, 21]
    return [
        motif * 5,  # repeats: the lookup finds it, and the model may well continue it
        [(i * 7919) % vocab for i in range(40)],  # no repeats: nothing to propose at first
        [3, 4, 5, 3, 4, 5, 3, 4] + [(i * 31) % vocab for i in range(10)] + [3, 4],
        list(range(10, 30)) * 2,
    ]


@pytest.mark.parametrize("name,depth", [("tiny-llama", 1), ("tiny-llama", 3), ("tiny-qwen3", 3)])
def test_greedy_is_token_exact_with_speculation(runners, name, depth):
    runner = runners[name]
    prompts = prompts_for(runner.info().vocab_size)
    reference, _ = generate(runner, prompts, None, depth=depth)
    plans = []
    spec_tokens, scheduler = generate(runner, prompts, SPEC, depth=depth, plans=plans)
    stats = scheduler.spec.stats
    assert spec_tokens == reference
    # depth 3: verify rows chained on rows in flight (launched before those finish), some void
    num_chained = sum(sum(p.draft_chained) for p in plans)
    assert (num_chained > 0) == (depth > 1)
    assert stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens > 0, "no proposal was ever accepted"
    assert stats.num_accepted_tokens < stats.num_draft_tokens, "no proposal was ever rejected"


def test_budget_counts_drafts(runners):
    """A step budget of a few tokens still gives token-exact outputs (drafts are cut to fit)."""
    runner = runners["tiny-llama"]
    prompts = prompts_for(runner.info().vocab_size)
    reference, _ = generate(runner, prompts, None, budget=64)
    spec_tokens, _ = generate(runner, prompts, SPEC, budget=6)
    assert spec_tokens == reference


def test_sampled_with_speculation_runs_and_is_replayable(runners, monkeypatch):
    from scheduler_svc.core.spec import gate as spec_gate

    # random sampling on a random model makes proposals rare; keep every request speculating
    # (the gate would stop them: tests/scheduler/core/spec/test_gate.py) to test the sampled path
    monkeypatch.setattr(spec_gate, "MIN_ACCEPTED", 0.0)
    runner = runners["tiny-llama"]
    prompts = prompts_for(runner.info().vocab_size)
    a, s = generate(runner, prompts, SPEC, temperature=0.8, top_k=20)
    b, _ = generate(runner, prompts, SPEC, temperature=0.8, top_k=20)
    assert a == b and all(len(t) == 48 for t in a.values())
    assert s.spec.stats.num_draft_tokens > 0


def test_sampled_with_speculation_gives_the_tokens_of_speculation_off(runners, monkeypatch, tmp_path):
    """A draft is accepted iff it is the sampler's own draw at its position (verify.match_drafts),
    so seeded sampling gives the tokens of speculation off — bit for bit when a verify row's
    logits are a decode row's (--deterministic: the CPU executor computes each row alone)."""
    from scheduler_svc.core.spec import gate as spec_gate

    monkeypatch.setattr(spec_gate, "MIN_ACCEPTED", 0.0)  # every request keeps speculating
    path = build_random_model(tmp_path / "tiny-llama", "tiny-llama")
    runner = build_runner(ExecutorConfig(
        model=str(path), device="cpu", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
        num_kv_blocks=96, max_model_len=256, block_size=16, deterministic=True))
    prompts = prompts_for(runner.info().vocab_size)
    for temperature, top_k in ((1.0, 2), (0.2, 0)):  # the sampler's sorting path, its one-pass path
        off, _ = generate(runner, prompts, None, temperature=temperature, top_k=top_k)
        on, scheduler = generate(runner, prompts, SPEC, temperature=temperature, top_k=top_k)
        assert on == off, (temperature, top_k)
        stats = scheduler.spec.stats  # (at 1.0 / top-k 2: 6 of 43 drafts accepted)
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, (temperature, top_k, stats)


def services_greedy_match_transformers(tmp_path_factory, hf_greedy, model_dirs, name: str, text: str,
                                       executor_args=()) -> dict[str, float]:
    """Both services as processes with --speculative-config `text` (and executor_args): the
    greedy streams of prompts_for(500) equal transformers', every block comes back; returns
    the scheduler's llmserve:spec_decode_num_* metrics."""
    import concurrent.futures as cf
    import urllib.request

    from benchmarks.cluster import free_port
    from benchmarks.cluster import generate as generate_rpc
    from tests.integration.conftest import start_cluster

    port = free_port()
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], name, executor_args=list(executor_args),
                            scheduler_args=["--speculative-config", text, "--metrics-port", str(port)])
    try:
        prompts = prompts_for(500)
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: generate_rpc(cluster.stub, prompt_ids=p, max_tokens=40,
                                                       temperature=0.0)[0], prompts))
        for p, ids in zip(prompts, got):
            assert ids == hf_greedy("llama", p, 40)
        assert cluster.wait_idle().free_blocks == cluster.status().total_blocks
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        cluster.stop()
    return {line.split()[0].split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("llmserve:spec_decode_num_")}


def test_both_services_with_speculation_match_transformers(tmp_path_factory, hf_greedy, model_dirs):
    """The flag through real processes: greedy streams equal transformers', drafts counted."""
    text = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    values = services_greedy_match_transformers(tmp_path_factory, hf_greedy, model_dirs, "spec", text)
    assert values["llmserve:spec_decode_num_draft_tokens_total"] > 0


def record_graph_sizes(runner) -> list[tuple[int, bool]]:
    """Wraps runner.launch (an instance attribute: `del runner.launch` restores it): the graph
    size of every launched verify step (0 = eager) and whether it was a decode graph (token
    rows, step_inputs.py) are appended to the returned list."""
    sizes, launch = [], runner.launch
    graphs = runner.graphs
    shapes = []
    if graphs is not None:  # its class's replay: a second call on one runner wraps it afresh
        replay = type(graphs).replay.__get__(graphs)
        graphs.replay = lambda shape: shapes.append(shape) or replay(shape)

    def recording(plan, *args, **kw):
        shapes.clear()
        handle = launch(plan, *args, **kw)
        if plan.num_draft_tokens:
            sizes.append((handle.out.graph_size, bool(shapes) and shapes[-1].decode))
        return handle

    runner.launch = recording
    return sizes
