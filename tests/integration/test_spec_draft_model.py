"""Speculative decoding with a draft model (executor_svc/spec_decode/draft.py) end to end on tiny
random models: the scheduler core driving a real ModelRunner through the step loop (as in
test_spec_decode.py), and both services as processes. Greedy outputs must be token-exact with
speculation off whatever the draft; a draft identical to the target accepts every draft; the
start-up refusals (vocabulary, tokenizer, tensor parallelism, a scheduler asking for a draft
model the executor lacks); cancellation mid-speculation frees everything."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.inprocess import InProcessTransport
from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.checks import ModelError
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.spec_decode import draft_model
from executor_svc.startup.build import build_runner
from llmserve.speculative import SpecDecodeConfig
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.engine.step_loop import StepLoop
from tests.integration.conftest import CPU_EXECUTOR
from tests.integration.test_spec_decode import generate, prompts_for

SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=64)


def spec(path) -> SpecDecodeConfig:
    return SpecDecodeConfig("draft_model", num_speculative_tokens=4, model=str(path))


def config(target, draft, **kw) -> ExecutorConfig:
    base = dict(model=str(target), device="cpu", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64,
                num_kv_blocks=96, max_model_len=256, block_size=16, speculative_model=str(draft),
                num_speculative_tokens=4)
    return ExecutorConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """target; same (the target's own folder as its draft); small (a smaller random model, its
    tokenizer); close (the target with 2% noise on its matrices: drafts accepted and rejected)."""
    base = tmp_path_factory.mktemp("draft-models")
    target = build_random_model(base / "target", "tiny-llama")
    small = build_random_model(base / "small", "tiny-llama", seed=1, **SMALL)
    close = base / "close"
    shutil.copytree(target, close)
    weights, g = load_file(close / "model.safetensors"), torch.Generator().manual_seed(0)
    save_file({k: v + 0.02 * v.std() * torch.randn(v.shape, generator=g) if v.dim() == 2 else v
               for k, v in weights.items()}, close / "model.safetensors", metadata={"format": "pt"})
    return dict(target=target, same=target, small=small, close=close)


@pytest.fixture(scope="module")
def runners(folders):
    return {name: build_runner(config(folders["target"], folders[name])) for name in ("same", "small", "close")}


@pytest.fixture(scope="module")
def reference(runners):
    runner = runners["same"]
    return generate(runner, prompts_for(runner.info().vocab_size), None, depth=1)[0]


@pytest.mark.parametrize("depth", [1, 3])
def test_a_draft_equal_to_the_target_accepts_every_draft(runners, reference, depth):
    runner = runners["same"]
    plans = []
    tokens, scheduler = generate(runner, prompts_for(runner.info().vocab_size), spec(runner.info().draft_model_path),
                                 depth=depth, plans=plans)
    assert tokens == reference
    # depth 3: rows chained on rows in flight, the draft proposing after the previous row's
    # tokens on the device (every one valid: nothing is rejected)
    assert (sum(sum(p.draft_chained) for p in plans) > 0) == (depth > 1)
    # 48 tokens a request: 1 from the prefill, then 9 verify rows of 4 drafts (5 tokens each)
    # and a last one of 1 draft (max_tokens): 10 rows, 37 drafts, every one accepted
    stats = scheduler.spec.stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (40, 148, 148)


@pytest.mark.parametrize("name,depth,budget", [("small", 1, 64), ("small", 3, 64), ("close", 1, 64),
                                               ("close", 3, 64), ("close", 3, 16)])
def test_greedy_is_token_exact_whatever_the_draft(runners, reference, name, depth, budget):
    """budget 16: the 20-40 token prompts are prefilled in chunks (the draft follows them)."""
    runner = runners[name]
    tokens, scheduler = generate(runner, prompts_for(runner.info().vocab_size), spec(runner.info().draft_model_path),
                                 depth=depth, budget=budget)
    assert tokens == reference
    stats = scheduler.spec.stats
    assert stats.num_draft_tokens > 0
    if name == "close":
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_sampled_with_a_draft_model_runs_and_is_replayable(runners):
    runner = runners["close"]
    prompts = prompts_for(runner.info().vocab_size)
    a, s = generate(runner, prompts, spec("close"), temperature=0.8, top_k=20)
    b, _ = generate(runner, prompts, spec("close"), temperature=0.8, top_k=20)
    assert a == b and all(len(t) == 48 for t in a.values())
    assert s.spec.stats.num_accepted_tokens > 0


def test_the_kv_memory_is_split_between_the_models(folders):
    budget = 1 << 20
    both = build_runner(config(folders["target"], folders["small"], num_kv_blocks=0, cpu_kv_cache_gib=budget / (1 << 30)))
    alone = build_runner(config(folders["target"], "", num_kv_blocks=0, cpu_kv_cache_gib=budget / (1 << 30)))
    target_bytes = 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, block 16, 2 KV heads of 16, float32
    draft_bytes = 2 * 1 * 16 * 1 * 16 * 4
    assert alone.info().num_blocks == budget // target_bytes and not alone.info().draft_model_path
    assert both.info().num_blocks == budget // (target_bytes + draft_bytes)
    assert both.info().draft_model_path == str(folders["small"])
    assert both.drafter.kv_caches[0].k.shape[0] == both.info().num_blocks


def test_cancel_mid_speculation_frees_everything(runners):
    runner = runners["same"]
    runner.reset()
    info = runner.info()
    scheduler = Scheduler(SchedulerCoreConfig(
        num_blocks=info.num_blocks, block_size=info.block_size, max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=64, max_model_len=info.max_model_len, eos_token_ids=tuple(info.eos_token_ids),
        speculative=spec(info.draft_model_path)))
    for i, prompt in enumerate(prompts_for(info.vocab_size)):
        scheduler.add_request(Request(i, prompt, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)))
    got = {}
    loop = StepLoop(scheduler, InProcessTransport(runner), 3,
                    lambda outputs, errors: [got.setdefault(o.req_id, []).extend(o.new_token_ids) for o in outputs])

    async def drive():
        for _ in range(20):  # until requests 0 and 2 have a verify step in flight
            await loop.step()
            if all(scheduler.requests[i].spec_rows for i in (0, 2)):
                break
        assert all(scheduler.requests[i].spec_rows and scheduler.requests[i].num_inflight_steps for i in (0, 2))
        for i in (0, 2):
            scheduler.abort_request(i)
        await loop.run_until_idle()

    asyncio.run(drive())
    assert scheduler.num_free_blocks == scheduler.num_total_blocks and not scheduler.requests
    assert not runner.batch.requests  # the executor forgot every row
    assert len(got[1]) == len(got[3]) == 48


def test_start_up_refuses_a_draft_it_cannot_use(folders, tmp_path):
    other_vocab = build_random_model(tmp_path / "v256", "tiny-llama", vocab_size=640, **SMALL)
    with pytest.raises(ModelError) as e:
        build_runner(config(folders["target"], other_vocab))
    assert str(e.value) == (f"draft model {other_vocab}: vocab_size 640 differs from the target's 512 "
                            "(a draft must share the target's tokenizer)")
    other_tokens = tmp_path / "tok"
    shutil.copytree(folders["small"], other_tokens)
    data = json.loads((other_tokens / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other_tokens / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ModelError, match=r"its tokenizer differs from the target's .* a draft must share"):
        build_runner(config(folders["target"], other_tokens))
    runner = build_runner(config(folders["target"], ""))
    with pytest.raises(ModelError) as e:
        draft_model.load_draft(config(folders["target"], folders["small"]), runner.model, folders["target"], 256, 2)
    assert str(e.value) == ("--speculative-config draft model with --tensor-parallel-size 2: not implemented "
                            "(draft models run on one device; use 1, or method ngram)")


def test_both_services_with_a_draft_model_match_transformers(tmp_path_factory, hf_greedy, model_dirs):
    """The flag through real processes (the launcher's form: the same JSON to both); greedy
    streams equal transformers', every draft accepted (the draft is the target's folder)."""
    from tests.integration.test_spec_decode import services_greedy_match_transformers

    text = json.dumps({"model": str(model_dirs["llama"]), "num_speculative_tokens": 3})
    values = services_greedy_match_transformers(tmp_path_factory, hf_greedy, model_dirs, "spec-draft", text,
                                                executor_args=["--speculative-config", text])
    drafted = values["llmserve:spec_decode_num_draft_tokens_total"]
    assert drafted > 0 and values["llmserve:spec_decode_num_accepted_tokens_total"] == drafted


def test_a_scheduler_asking_for_a_draft_model_the_executor_lacks_exits(model_dirs, tmp_path):
    """Exit status 1 and one line naming the mismatch, before serving anything."""
    import os

    from benchmarks.cluster import ROOT, free_ports
    from llmserve.flags import services_env

    env = services_env({**os.environ, "OMP_NUM_THREADS": "1"}, "test-token")
    executor_port, scheduler_port = free_ports(2)
    log = open(tmp_path / "executor.log", "w")
    executor = subprocess.Popen([sys.executable, "-m", "executor_svc", "--model", str(model_dirs["llama"]),
                                 *CPU_EXECUTOR, "--port", str(executor_port)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        text = json.dumps({"model": str(model_dirs["llama"]), "num_speculative_tokens": 3})
        done = subprocess.run([sys.executable, "-m", "scheduler_svc", "--port", str(scheduler_port), "--http-port", "0",
                               "--executor-address", f"127.0.0.1:{executor_port}", "--speculative-config", text],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    finally:
        executor.terminate()
        executor.wait(30)
        log.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "llmserve-scheduler: the engine core could not start: ValueError: --speculative-config method "
        "draft_model: the executor has no draft model (start it with the same --speculative-config, "
        "naming the draft's \"model\")")
