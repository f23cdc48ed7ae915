"""benchmarks/spec_step_cost.py on the CPU (tiny random model): with speculation forced on,
every decode step after the prefill is a verify step of k drafts, outputs' figures complete."""

from __future__ import annotations

from benchmarks.spec_step_cost import FIELDS, compare
from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.startup.build import build_runner


def test_forced_speculation_verifies_every_decode_step(tmp_path):
    path = build_random_model(tmp_path / "tiny", "tiny-llama")
    runner = build_runner(ExecutorConfig(model=str(path), device="cpu", dtype="float32", max_num_seqs=4,
                                         max_num_batched_tokens=256, num_kv_blocks=64, block_size=16))
    off, on = compare(runner, [2], max_tokens=16)
    assert (off["mode"], on["mode"]) == ("off", "on") and off["verify_steps"] == 0
    # every step verifies (drafts of a random model: about one token a step) but the prefill,
    # the last token's (no room for a draft before max_tokens) and the plan that only reports
    # the finished requests
    assert on["verify_steps"] == on["steps"] - 3 and on["steps"] <= off["steps"] == 17
    assert all(on[f] >= 0 for f in FIELDS) and on["tokens_per_s"] > 0
