"""Sliding-window attention (Mistral every layer, Qwen2/Qwen3 per layer) is token-exact with
transformers' greedy generate past the window, and never reads a KV block that lies wholly
before it."""

from __future__ import annotations

import pytest
import torch

from executor_svc.model_loader.random_model import build_random_model
from step_protocol.domain import CachedRequestData, NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import decode_rows, hf_greedy, make_runner

WINDOW, BLOCK_SIZE = 8, 8
PROMPT = list(range(3, 33))  # 30 tokens: 3+ blocks fall out of the window before decoding starts
NUM_TOKENS = 24


def runner_greedy(runner, prompt: list[int], num_tokens: int, chunks: list[int] | None = None,
                  poison_window: int = 0) -> list[int]:
    """Greedy tokens of one request through runner.execute: the prompt in `chunks` (default one
    step), then decode steps. poison_window > 0: before each step, every block wholly before
    the window of that step's first token is filled with NaN in every layer (a read shows)."""
    runner.reset()
    block_size = runner.info().block_size
    block_ids = list(range(1, 1 + -(-(len(prompt) + num_tokens) // block_size)))
    chunks = chunks or [len(prompt)]
    computed, tokens = 0, []

    def run(step_id: int, plan: StepPlan) -> dict[int, int]:
        if poison_window:
            first_visible = max(computed - poison_window + 1, 0)
            for k_cache, v_cache, *_ in runner.kv_caches:
                for block in block_ids[:first_visible // block_size]:
                    k_cache[block] = float("nan")
                    v_cache[block] = float("nan")
        return runner.execute(plan).sampled()

    sampled = run(1, StepPlan(1, [NewRequestData(1, prompt, SamplerParams(), block_ids, 0, chunks[0])]))
    computed = chunks[0]
    for step_id, chunk in enumerate(chunks[1:], start=2):
        rows = CachedRequestData()
        rows.append(1, chunk, [])
        sampled = run(step_id, StepPlan(step_id, [], rows))
        computed += chunk
    tokens.append(sampled[1])
    for step_id in range(len(chunks) + 1, len(chunks) + num_tokens):
        tokens.append(run(step_id, StepPlan(step_id, [], decode_rows([1])))[1])
        computed += 1
    return tokens


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """(windowed folder, the same weights with full attention)."""
    base = tmp_path_factory.mktemp("mistral")
    return (build_random_model(base / "window", "tiny-mistral", sliding_window=WINDOW),
            build_random_model(base / "full", "tiny-mistral", sliding_window=None))


@pytest.mark.parametrize("chunks", [None, [13, 17], [5, 1, 24]])
def test_mistral_window_matches_transformers(mistral, chunks):
    windowed, full = mistral
    runner = make_runner(windowed, block_size=BLOCK_SIZE)
    assert [layer.self_attn.sliding_window for layer in runner.model.layers] == [WINDOW, WINDOW]
    ours = runner_greedy(runner, PROMPT, NUM_TOKENS, chunks)
    assert ours == hf_greedy(_hf(windowed), PROMPT, NUM_TOKENS)
    # The window changes the text: full attention over the same weights writes another.
    assert ours != runner_greedy(make_runner(full, block_size=BLOCK_SIZE), PROMPT, NUM_TOKENS, chunks)


@pytest.mark.parametrize("chunks", [None, [13, 17]])
def test_blocks_before_the_window_are_never_read(mistral, chunks):
    """NaN in every block wholly before the window leaves the tokens exact: such blocks could
    be freed (and reused) while the request runs."""
    windowed, _ = mistral
    runner = make_runner(windowed, block_size=BLOCK_SIZE)
    poisoned = runner_greedy(runner, PROMPT, NUM_TOKENS, chunks, poison_window=WINDOW)
    assert torch.isnan(runner.kv_caches[0][0][1]).all(), "the first block was not poisoned"
    assert poisoned == hf_greedy(_hf(windowed), PROMPT, NUM_TOKENS)


QWEN_MIXED = [  # (arch, config fields, the window of each of the 2 layers)
    ("tiny-qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1), (0, WINDOW)),
    ("tiny-qwen3", dict(use_sliding_window=True, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"]), (WINDOW, 0)),
]


@pytest.mark.parametrize("arch, fields, windows", QWEN_MIXED, ids=["qwen2-max_window_layers", "qwen3-layer_types"])
def test_qwen_mixed_layers_match_transformers(tmp_path, arch, fields, windows):
    path = build_random_model(tmp_path / "window", arch, **fields)
    full = build_random_model(tmp_path / "full", arch, use_sliding_window=False)
    runner = make_runner(path, block_size=BLOCK_SIZE)
    assert tuple(layer.self_attn.sliding_window or 0 for layer in runner.model.layers) == windows
    for chunks in (None, [13, 17]):
        ours = runner_greedy(runner, PROMPT, NUM_TOKENS, chunks)
        assert ours == hf_greedy(_hf(path), PROMPT, NUM_TOKENS), chunks
    assert ours != runner_greedy(make_runner(full, block_size=BLOCK_SIZE), PROMPT, NUM_TOKENS)
