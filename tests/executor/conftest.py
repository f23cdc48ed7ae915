"""Tiny random models built once per session; HF reference models on the same folders; plan pieces."""

from __future__ import annotations

import pytest
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.startup.build import build_runner
from executor_svc.worker.model_runner import ModelRunner
from step_protocol.domain import CachedRequestData

ARCHS = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3")


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return {name: build_random_model(base / name, name) for name in ARCHS}


@pytest.fixture(scope="session")
def hf_models(model_dirs):
    from transformers import AutoModelForCausalLM

    return {name: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for name, path in model_dirs.items()}


def make_runner(path, **overrides) -> ModelRunner:
    kw = dict(model=str(path), device="cpu", dtype="float32", max_num_seqs=8,
              max_num_batched_tokens=256, num_kv_blocks=128, max_model_len=512)
    kw.update(overrides)
    return build_runner(ExecutorConfig(**kw))


def hf_greedy(hf_model, prompt: list[int], num_tokens: int) -> list[int]:
    out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
                            do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def cached_rows(*rows: tuple) -> CachedRequestData:
    """The columns of rows (req_id, num_scheduled_tokens[, new_block_ids])."""
    data = CachedRequestData()
    for req_id, num_tokens, *blocks in rows:
        data.append(req_id, num_tokens, list(blocks[0]) if blocks else [])
    return data


decode_rows = CachedRequestData.decode_rows
