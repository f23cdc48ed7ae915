"""Our model matches transformers on the same random checkpoint (float32)."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.startup.kv_cache import allocate_kv_caches
from tests.executor.conftest import ARCHS


def _prefill_meta(num_tokens: int, block_ids: list[int], block_size: int) -> AttentionMetadata:
    table = torch.tensor([block_ids], dtype=torch.int32)
    pos = torch.arange(num_tokens)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    return AttentionMetadata(slot_mapping=slots, block_tables=table,
                             seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
                             max_query_len=num_tokens, max_seq_len=num_tokens, is_decode=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, model_dirs, hf_models):
    model = load_model(model_dirs[arch], "cpu", torch.float32)
    caches = allocate_kv_caches(model.args, 8, 16, torch.float32, torch.device("cpu"))
    ids = torch.randint(0, model.args.vocab_size, (37,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        hidden = model(ids, torch.arange(37), _prefill_meta(37, [5, 2, 7], 16), caches)  # [T, H]
        logits = model.compute_logits(hidden)  # [T, V]
        ref = hf_models[arch](ids[None]).logits[0]
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    assert caches[0][0][0].abs().sum() == 0, "block 0 (null) must stay untouched"


def test_llama3_rope_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from executor_svc.model_loader.random_model import build_random_model

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    path = build_random_model(tmp_path / "m", "tiny-llama", rope_parameters=scaling)
    model = load_model(path, "cpu", torch.float32)
    assert model.args.rope_scaling["rope_type"] == "llama3" and model.args.rope_theta == 500000.0
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    caches = allocate_kv_caches(model.args, 8, 16, torch.float32, torch.device("cpu"))
    ids = torch.arange(3, 100)
    with torch.inference_mode():
        logits = model.compute_logits(model(ids, torch.arange(97), _prefill_meta(97, [1, 2, 3, 4, 5, 6, 7], 16), caches))
        ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def _chunk_meta(start: int, end: int, block_ids: list[int], block_size: int) -> AttentionMetadata:
    """One request computing positions start..end-1; positions before start are in the cache."""
    table = torch.tensor([block_ids], dtype=torch.int32)
    pos = torch.arange(start, end)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    return AttentionMetadata(slot_mapping=slots, block_tables=table,
                             seq_lens=torch.tensor([end], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
                             max_query_len=end - start, max_seq_len=end, is_decode=False)


def test_a_cached_prefix_gives_the_logits_of_computing_everything(model_dirs, hf_models):
    """Prefix caching on the executor side: a second sequence whose block table starts with
    another's full blocks computes only its own tail, with the logits of a full prefill."""
    model = load_model(model_dirs["tiny-llama"], "cpu", torch.float32)
    caches = allocate_kv_caches(model.args, 8, 16, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(2)
    first = torch.randint(0, model.args.vocab_size, (37,), generator=gen)
    second = torch.cat([first[:32], torch.randint(0, model.args.vocab_size, (6,), generator=gen)])
    with torch.inference_mode():
        model(first, torch.arange(37), _prefill_meta(37, [5, 2, 7], 16), caches)  # writes 5, 2, 7
        hidden = model(second[32:], torch.arange(32, 38), _chunk_meta(32, 38, [5, 2, 3], 16), caches)
        logits = model.compute_logits(hidden)  # [6, V]: positions 32..37 only
        ref = hf_models["tiny-llama"](second[None]).logits[0, 32:]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
