"""What the executor decodes and encodes (step_protocol.codec), configuration from flags and
environment (the internal token of both services too), loader edge cases."""

from __future__ import annotations

import json

import pytest
import torch

from executor_svc.config import ExecutorConfig, default_cuda_graph_sizes
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.model_loader.safetensors import eos_token_ids, load_hf_config, load_model
from protos.llmserve.executor.v1 import executor_pb2 as pb
from step_protocol import codec
from step_protocol.domain import (CachedRequestData, ExecutorInfo, NewRequestData, SamplerParams,
                                  StepPlan, StepResult)


def _over_the_wire(msg):
    return type(msg).FromString(msg.SerializeToString())


def test_plan_round_trip():
    plan = StepPlan(
        step_id=9,
        new_requests=[NewRequestData(3, [1, 2, 3], SamplerParams(0.5, 10, 0.75, (1 << 63) + 5),
                                     [4, 5], 16, 2)],
        cached_requests=CachedRequestData(req_ids=[1, 2, 5], num_scheduled_tokens=[1, 1, 7],
                                          num_new_blocks=[1, 0, 2], new_block_ids=[7, 8, 9]),
        finished_req_ids=[11], preempted_req_ids=[12, 13])
    assert codec.plan_from_pb(_over_the_wire(codec.plan_to_pb(plan))) == plan
    # the message as any scheduler writes it: columns stay columns, row i owns num_new_blocks[i]
    msg = pb.StepPlan(step_id=9, cached_requests=pb.CachedRequests(
        req_ids=[1, 2, 5], num_scheduled_tokens=[1, 1, 7], num_new_blocks=[1, 0, 2], new_block_ids=[7, 8, 9]))
    assert codec.plan_from_pb(_over_the_wire(msg)).cached_requests == plan.cached_requests


def test_result_and_info_to_pb():
    out = StepResult(step_id=4, req_ids=[1, 2], token_ids=[10, 20], prepare_us=5, forward_us=6,
                     sample_us=7, graph_size=8, queued_us=9, launch_us=10, launch_cpu_us=11, device_idle_us=12)
    assert codec.result_from_pb(_over_the_wire(codec.result_to_pb(out))) == out
    assert codec.result_to_pb(StepResult(step_id=4, error="boom")).error == "boom"
    info = ExecutorInfo("m", "/p", 512, (1, 2), 2048, 16, 100, (1, 2, 4), 8, 256, "cpu", "float32")
    msg = _over_the_wire(codec.info_to_pb(info))
    assert isinstance(msg, pb.ExecutorInfo) and codec.info_from_pb(msg) == info
    assert list(msg.eos_token_ids) == [1, 2] and msg.num_blocks == 100 and msg.model_path == "/p"


def test_config_flags_env_fallback_and_defaults(monkeypatch):
    monkeypatch.setenv("LLMSERVE_EXECUTOR_PORT", "6000")
    monkeypatch.setenv("LLMSERVE_EXECUTOR_MAX_NUM_SEQS", "24")
    monkeypatch.setenv("LLMSERVE_EXECUTOR_ENFORCE_EAGER", "1")
    cfg = ExecutorConfig.from_args(["--device", "cpu", "--block-size", "32"])
    assert (cfg.port, cfg.max_num_seqs, cfg.block_size, cfg.enforce_eager) == (6000, 24, 32, True)
    assert cfg.dtype == "float32" and cfg.max_num_batched_tokens == 2048 and not cfg.use_cuda_graphs
    assert ExecutorConfig.from_args(["--device", "cpu", "--port", "7000"]).port == 7000  # flag wins
    with pytest.raises(Exception):
        cfg.port = 1  # frozen
    assert default_cuda_graph_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert default_cuda_graph_sizes(20)[-1] == 20
    cfg = ExecutorConfig.from_args(["--device", "cpu", "--max-num-seqs", "16", "--cuda-graph-sizes", "4,1,64"])
    assert cfg.cuda_graph_sizes == (1, 4)


def test_graph_and_kernel_flags_defaults_and_refusals(capsys):
    cfg = ExecutorConfig.from_args(["--device", "cpu", "--max-num-batched-tokens", "600"])
    assert cfg.mixed_cuda_graph_sizes == tuple(range(32, 513, 32))  # within the token budget
    assert cfg.skinny_max_tokens == 1 and cfg.quantization == ""
    cfg = ExecutorConfig.from_args(["--device", "cpu", "--mixed-cuda-graph-sizes", "none", "--skinny-max-tokens", "0"])
    assert cfg.mixed_cuda_graph_sizes == () and cfg.skinny_max_tokens == 0
    assert ExecutorConfig.from_args(["--device", "cpu", "--mixed-cuda-graph-sizes", "96,1,48"]).mixed_cuda_graph_sizes == (48, 96)
    for flag, value, needle in [("--mixed-cuda-graph-sizes", "64,abc", "comma-separated integers"),
                                ("--cuda-graph-sizes", "8,-1", "must be positive"),
                                ("--skinny-max-tokens", "17", "must be 0..16"),
                                ("--quantization", "gptq", "must be fp8 or none")]:
        with pytest.raises(SystemExit):
            ExecutorConfig.from_args(["--device", "cpu", flag, value])
        assert needle in capsys.readouterr().err, flag


def test_internal_token_flags_env_precedence_and_repr(monkeypatch):
    from llmserve.launcher import services_env
    from scheduler_svc.config import from_args as scheduler_from_args

    monkeypatch.setenv("LLMSERVE_INTERNAL_TOKEN", "shared")
    cfg = ExecutorConfig.from_args(["--device", "cpu"])
    assert (cfg.internal_token, cfg.insecure_no_auth, cfg.enable_reflection) == ("shared", False, False)
    assert scheduler_from_args([]).internal_token == "shared"
    monkeypatch.setenv("LLMSERVE_EXECUTOR_INTERNAL_TOKEN", "own")  # the service's own variable wins
    monkeypatch.setenv("LLMSERVE_SCHEDULER_INTERNAL_TOKEN", "own")
    assert ExecutorConfig.from_args(["--device", "cpu"]).internal_token == "own"
    assert scheduler_from_args([]).internal_token == "own"
    cfg = ExecutorConfig.from_args(["--device", "cpu", "--internal-token", "flag", "--enable-reflection"])
    assert cfg.internal_token == "flag" and cfg.enable_reflection  # the flag wins over both
    assert "flag" not in repr(cfg) and "own" not in repr(scheduler_from_args([]))
    monkeypatch.setenv("LLMSERVE_EXECUTOR_INSECURE_NO_AUTH", "1")
    assert ExecutorConfig.from_args(["--device", "cpu"]).insecure_no_auth
    env = services_env({"PATH": "/bin", "LLMSERVE_EXECUTOR_INTERNAL_TOKEN": "stale"}, "fresh")
    assert env == {"PATH": "/bin", "LLMSERVE_INTERNAL_TOKEN": "fresh"}  # both children get one token


def test_sharded_checkpoint_with_tied_embeddings(tmp_path, model_dirs):
    sharded = build_random_model(tmp_path / "s", "tiny-llama", shard_bytes=40_000, tie_word_embeddings=True)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and "lm_head.weight" not in index["weight_map"]
    model = load_model(sharded, "cpu", torch.float32)
    assert model.lm_head.weight is model.embed_tokens.weight
    single = build_random_model(tmp_path / "one", "tiny-llama", tie_word_embeddings=True)
    ref = load_model(single, "cpu", torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), name  # same seed: same weights however they are stored


def test_eos_ids_and_unsupported_type(tmp_path, model_dirs):
    path = model_dirs["tiny-qwen2"]
    assert eos_token_ids(path, load_hf_config(path)) == [1]
    cfg = json.loads((path / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "n_embd": 64}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        load_model(bad, "cpu", torch.float32)


def test_deterministic_flag_aliases_env_and_refusals(monkeypatch, capsys):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("LLMSERVE_EXECUTOR_DETERMINISTIC", raising=False)
    plain = ExecutorConfig.from_args(["--device", "cpu"])
    assert (plain.deterministic, plain.skinny_max_tokens) == (False, 1)
    for argv in (["--deterministic"], ["--enable-deterministic-inference"]):  # ours, SGLang's
        cfg = ExecutorConfig.from_args(["--device", "cpu", *argv])
        assert (cfg.deterministic, cfg.skinny_max_tokens) == (True, 0)  # the skinny path is off
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # vLLM's switch
    assert ExecutorConfig.from_args(["--device", "cpu"]).deterministic
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    monkeypatch.setenv("LLMSERVE_EXECUTOR_DETERMINISTIC", "1")
    assert ExecutorConfig.from_args(["--device", "cpu"]).deterministic
    for argv, what in ((["--tensor-parallel-size", "2"], "--tensor-parallel-size 1"),
                       (["--quantization", "fp8"], "no --quantization")):
        with pytest.raises(SystemExit) as exit_:
            ExecutorConfig.from_args(["--device", "cpu", "--deterministic", *argv])
        assert exit_.value.code == 2 and what in capsys.readouterr().err


def test_persistent_decode_flag_and_refusals(monkeypatch, capsys):
    monkeypatch.delenv("LLMSERVE_EXECUTOR_PERSISTENT_DECODE", raising=False)
    assert not ExecutorConfig.from_args(["--device", "cuda"]).persistent_decode  # off by default
    assert ExecutorConfig.from_args(["--device", "cuda", "--persistent-decode"]).persistent_decode
    monkeypatch.setenv("LLMSERVE_EXECUTOR_PERSISTENT_DECODE", "1")
    assert ExecutorConfig.from_args(["--device", "cuda"]).persistent_decode
    for argv in (["--device", "cpu"], ["--device", "cuda", "--deterministic"],
                 ["--device", "cuda", "--tensor-parallel-size", "2"], ["--device", "cuda", "--quantization", "fp8"],
                 ["--device", "cuda", "--kv-cache-dtype", "fp8"]):
        with pytest.raises(SystemExit) as exit_:
            ExecutorConfig.from_args([*argv, "--persistent-decode"])
        assert exit_.value.code == 2 and "--persistent-decode runs on one CUDA device" in capsys.readouterr().err
