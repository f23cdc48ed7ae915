"""Scheduler flags that reach the scheduler core (engine/core_process.core_config)."""

import pytest

from scheduler_svc.config import from_args
from scheduler_svc.engine.core_process import core_config
from step_protocol.domain import ExecutorInfo

INFO = ExecutorInfo("m", "/m", vocab_size=100, eos_token_ids=(2,), max_model_len=512, block_size=16,
                    num_blocks=64, cuda_graph_sizes=(), max_num_seqs=8, max_num_batched_tokens=256,
                    device="cpu", dtype="float32")


def test_prefix_caching_is_on_by_default_and_its_flags_reach_the_core(monkeypatch):
    assert from_args([]).enable_prefix_caching and core_config(from_args([]), INFO).enable_prefix_caching
    off = from_args(["--no-enable-prefix-caching"])
    assert not off.enable_prefix_caching and not core_config(off, INFO).enable_prefix_caching
    monkeypatch.setenv("LLMSERVE_SCHEDULER_ENABLE_PREFIX_CACHING", "false")
    assert not from_args([]).enable_prefix_caching
    assert from_args(["--enable-prefix-caching"]).enable_prefix_caching  # the flag wins


def test_pipeline_depth_default_and_bounds(capsys):
    assert from_args([]).pipeline_depth == 3 and from_args(["--pipeline-depth", "1"]).pipeline_depth == 1
    for bad in ("0", "9"):
        with pytest.raises(SystemExit):
            from_args(["--pipeline-depth", bad])
        assert "must be 1..8" in capsys.readouterr().err
