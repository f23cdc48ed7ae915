"""Request checks and defaults (pure functions; the integration tests check the status codes)."""

import pytest

from scheduler_svc.api.validation import Limits, RawParams, build_sampling_params, check_prompt
from scheduler_svc.messages import RequestError

# 784 KV slots: room for 785 tokens, as the last sampled token is never fed back (one rule with
# the scheduler core: kv_cache_manager.max_blocks_needed)
LIMITS = Limits(max_model_len=2048, vocab_size=512, block_size=16, num_usable_blocks=49)


def test_unset_max_tokens_fills_the_context_within_the_cache():
    assert build_sampling_params(RawParams(), 10, LIMITS).max_tokens == 785 - 10
    roomy = Limits(max_model_len=100, vocab_size=512, block_size=16, num_usable_blocks=49)
    assert build_sampling_params(RawParams(), 10, roomy).max_tokens == 90


def test_defaults_and_seed():
    p = build_sampling_params(RawParams(max_tokens=5), 10, LIMITS)
    assert (p.temperature, p.top_k, p.top_p, p.ignore_eos) == (1.0, 0, 1.0, False)
    assert 0 <= p.seed < 2**63
    assert build_sampling_params(RawParams(max_tokens=5, seed=7), 10, LIMITS).seed == 7


@pytest.mark.parametrize("raw,prompt_len,code,needle", [
    (RawParams(max_tokens=0), 10, "INVALID_ARGUMENT", "at least 1"),
    (RawParams(max_tokens=2040), 10, "INVALID_ARGUMENT", "at most 2038"),
    (RawParams(max_tokens=775), 10, "RESOURCE_EXHAUSTED", None),  # exactly fills the cache
    (RawParams(max_tokens=776), 10, "RESOURCE_EXHAUSTED", "needs up to 50 KV blocks"),
    (RawParams(), 800, "RESOURCE_EXHAUSTED", "cache holds 49"),
    (RawParams(max_tokens=5, temperature=float("nan")), 10, "INVALID_ARGUMENT", "temperature"),
    (RawParams(max_tokens=5, stop=("",)), 10, "INVALID_ARGUMENT", "non-empty"),
    (RawParams(max_tokens=5, stop_token_ids=(512,)), 10, "INVALID_ARGUMENT", "stop_token_ids"),
])
def test_refusals(raw, prompt_len, code, needle):
    if needle is None:  # the edge case that fits
        assert build_sampling_params(raw, prompt_len, LIMITS).max_tokens == raw.max_tokens
        return
    with pytest.raises(RequestError) as err:
        build_sampling_params(raw, prompt_len, LIMITS)
    assert err.value.code == code and needle in err.value.message


def test_prompt_checks():
    check_prompt([3] * 2047, LIMITS)
    for prompt, needle in [([], "empty"), ([3] * 2048, "at most 2047"), ([3, 600], "vocabulary")]:
        with pytest.raises(RequestError) as err:
            check_prompt(prompt, LIMITS)
        assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.message
