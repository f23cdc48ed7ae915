"""Rope scalings (linear, dynamic NTK, yarn, llama3): the cos/sin table equals transformers'
rotary embedding bit for bit, and greedy generation is token-exact with transformers while
differing from default rope."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.random_model import build_random_model
from executor_svc.model_loader.safetensors import load_model
from executor_svc.models import layers
from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.llama import ModelArgs
from executor_svc.startup.kv_cache import allocate_kv_caches
from tests.executor.conftest import hf_greedy, make_runner
from tests.executor.models.test_sliding_window import runner_greedy

THETA = 1e4
LINEAR = {"rope_type": "linear", "factor": 4.0, "rope_theta": THETA}
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": THETA}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": THETA}
YARN_OPTIONS = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128, "rope_theta": THETA,
                "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}
YARN_FACTOR = {**YARN, "attention_factor": 0.9}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": THETA}


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _transformers_table(cfg, num_positions: int, one_at_a_time: bool) -> torch.Tensor:
    """[num_positions, D] cos | sin halves from transformers' Qwen2RotaryEmbedding; one position
    per forward, in order, as decode steps call it (dynamic rope rescales per forward)."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    emb, x = Qwen2RotaryEmbedding(cfg), torch.zeros(1)
    batches = [torch.tensor([[p]]) for p in range(num_positions)] if one_at_a_time else [torch.arange(num_positions)[None]]
    rows = []
    for positions in batches:
        cos, sin = emb(x, positions)
        half = cos.shape[-1] // 2
        rows.append(torch.cat([cos[0, :, :half], sin[0, :, :half]], dim=-1))
    return torch.cat(rows)


@pytest.mark.parametrize("rope", [LINEAR, DYNAMIC, YARN, YARN_OPTIONS, YARN_FACTOR, LLAMA3],
                         ids=["linear", "dynamic", "yarn", "yarn-options", "yarn-attention_factor", "llama3"])
def test_cos_sin_table_equals_transformers(rope):
    from transformers import Qwen2Config

    mpe, num_positions = 64, 160  # past max_position_embeddings: dynamic rescales there
    cfg = Qwen2Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=mpe, rope_parameters=dict(rope))
    args = ModelArgs.from_hf_config(cfg)
    table = layers.rope_cos_sin_cache(args.head_dim, num_positions, args.rope_theta, args.rope_scaling, mpe)
    dynamic = rope["rope_type"] == "dynamic"
    assert torch.equal(table, _transformers_table(cfg, num_positions, one_at_a_time=dynamic))
    default = layers.rope_cos_sin_cache(args.head_dim, num_positions, args.rope_theta, None, mpe)
    if dynamic:  # default frequencies up to max_position_embeddings, rescaled after
        assert torch.equal(table[:mpe], default[:mpe]) and not torch.equal(table[mpe], default[mpe])
    else:
        assert not torch.equal(table, default)


GENERATIONS = [  # (arch, max_position_embeddings, rope, --max-model-len): prompt 50 + 40 tokens
    ("tiny-llama", 2048, LINEAR, 512),
    ("tiny-qwen2", 64, YARN, 256),  # Qwen2.5-style: generates past max_position_embeddings
    ("tiny-qwen3", 256, YARN_OPTIONS, 256),
    ("tiny-mistral", 256, LLAMA3, 256),
]
PROMPT, NUM_TOKENS = list(range(3, 53)), 40


@pytest.mark.parametrize("arch, mpe, rope, max_model_len", GENERATIONS, ids=[g[2]["rope_type"] + "-" + g[0]
                                                                             for g in GENERATIONS])
def test_generation_matches_transformers_and_not_default_rope(tmp_path, arch, mpe, rope, max_model_len):
    path = build_random_model(tmp_path / "scaled", arch, max_position_embeddings=mpe, rope_parameters=rope)
    plain = build_random_model(tmp_path / "plain", arch, max_position_embeddings=512)  # same weights
    ours = runner_greedy(make_runner(path, max_model_len=max_model_len), PROMPT, NUM_TOKENS)
    assert ours == hf_greedy(_hf(path), PROMPT, NUM_TOKENS)
    assert ours != runner_greedy(make_runner(plain, max_model_len=max_model_len), PROMPT, NUM_TOKENS)


def _meta(start: int, end: int, num_blocks: int, block_size: int) -> AttentionMetadata:
    """One request computing positions start..end-1 over blocks 1..num_blocks."""
    table = torch.arange(1, num_blocks + 1, dtype=torch.int32)[None]
    pos = torch.arange(start, end)
    return AttentionMetadata(slot_mapping=table[0, pos // block_size].long() * block_size + pos % block_size,
                             block_tables=table, seq_lens=torch.tensor([end], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
                             max_query_len=end - start, max_seq_len=end, is_decode=end - start == 1)


@torch.inference_mode()
def _model_greedy(model, prompt: list[int], num_tokens: int, block_size: int = 16) -> list[int]:
    num_blocks = -(-(len(prompt) + num_tokens) // block_size)
    caches = allocate_kv_caches(model.args, num_blocks + 1, block_size, torch.float32, torch.device("cpu"))
    ids, start = list(prompt), 0
    while len(ids) < len(prompt) + num_tokens:
        hidden = model(torch.tensor(ids[start:]), torch.arange(start, len(ids)),
                       _meta(start, len(ids), num_blocks, block_size), caches)
        start = len(ids)
        ids.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return ids[len(prompt):]


def test_dynamic_rope_is_default_within_max_positions_and_rescales_past_them(tmp_path):
    """Served (<= max_position_embeddings): the tokens of default rope, as in transformers.
    A longer table (which serving refuses) follows transformers' decode steps past it, for a
    prompt within max_position_embeddings (transformers then rescales from each step's length)."""
    mpe = 32
    path = build_random_model(tmp_path / "dynamic", "tiny-llama", max_position_embeddings=mpe,
                              rope_parameters=DYNAMIC)
    plain = build_random_model(tmp_path / "plain", "tiny-llama", max_position_embeddings=mpe)
    prompt = PROMPT[:20]
    served = runner_greedy(make_runner(path, max_model_len=mpe), prompt, mpe - len(prompt))
    assert served == hf_greedy(_hf(path), prompt, mpe - len(prompt))
    assert served == runner_greedy(make_runner(plain, max_model_len=mpe), prompt, mpe - len(prompt))

    model, default = load_model(path, "cpu", torch.float32), load_model(plain, "cpu", torch.float32)
    assert torch.equal(model.cos_sin_cache, default.cos_sin_cache)
    head_dim = model.args.head_dim
    model.cos_sin_cache = layers.rope_cos_sin_cache(head_dim, 3 * mpe, THETA, model.args.rope_scaling, mpe)
    default.cos_sin_cache = layers.rope_cos_sin_cache(head_dim, 3 * mpe, THETA, None, mpe)
    ours = _model_greedy(model, prompt, 60)  # positions up to 79
    assert ours == hf_greedy(_hf(path), prompt, 60)  # a fresh transformers model: it keeps state
    assert ours != _model_greedy(default, prompt, 60)
