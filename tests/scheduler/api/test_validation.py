"""Request checks, size limits and defaults (pure functions; the integration tests check the
status codes)."""

import pytest

from scheduler_svc.api.prompts import ChatPrompt, TextPrompt, TokenIdsPrompt
from scheduler_svc.api.validation import (MAX_REQUEST_ID_BYTES, Limits, RawParams, SizeLimits,
                                          build_sampling_params, check_prompt, check_prompt_size,
                                          check_request_size, max_request_bytes)
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


# --- size limits, checked before tokenizing ---------------------------------------------------

SIZES = SizeLimits(max_prompt_bytes=100, max_chat_messages=3, max_stop_strings=2, max_stop_bytes=10,
                   max_stop_token_ids=4)


class Turn:
    def __init__(self, role, content):
        self.role, self.content = role, content


@pytest.mark.parametrize("prompt,needle", [
    (None, "no input"),
    (TextPrompt(""), "empty"),
    (TokenIdsPrompt([]), "empty"),
    (ChatPrompt([]), "no messages"),
    (TextPrompt("a" * 101), "the prompt text has 101 bytes; the limit is 100 (--max-prompt-bytes)"),
    (TextPrompt("é" * 51), "102 bytes"),  # UTF-8 bytes, not characters
    (TokenIdsPrompt([3] * 2048), "--max-model-len"),
    (ChatPrompt([Turn("user", "x")] * 4), "4 messages; the limit is 3 (--max-chat-messages)"),
    (ChatPrompt([Turn("user", "x" * 48)] * 2), "104 bytes of roles and contents"),
])
def test_prompt_size_refusals(prompt, needle):
    with pytest.raises(RequestError) as err:
        check_prompt_size(prompt, SIZES, LIMITS)
    assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.message


def test_prompts_at_the_limits_pass():
    for prompt in [TextPrompt("a" * 100), TextPrompt("é" * 50), TokenIdsPrompt([3] * 2047),
                   ChatPrompt([Turn("user", "x" * 29)] * 3), ChatPrompt([Turn("user", "")])]:
        check_prompt_size(prompt, SIZES, LIMITS)  # an all-empty chat still renders a prompt


@pytest.mark.parametrize("raw,request_id,needle", [
    (RawParams(stop=("a", "b", "c")), "", "3 strings; the limit is 2 (--max-stop-strings)"),
    (RawParams(stop=("aaaaaa", "bbbbbé")), "", "13 bytes; the limit is 10 (--max-stop-bytes)"),
    (RawParams(stop_token_ids=(1,) * 5), "", "5 ids; the limit is 4 (--max-stop-token-ids)"),
    (RawParams(), "r" * (MAX_REQUEST_ID_BYTES + 1), "request_id"),
])
def test_request_size_refusals(raw, request_id, needle):
    with pytest.raises(RequestError) as err:
        check_request_size(raw, request_id, SIZES)
    assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.message
    check_request_size(RawParams(stop=("aaaaa", "bbbbb"), stop_token_ids=(1,) * 4), "r" * 256, SIZES)


def test_receive_limit_holds_the_largest_allowed_request():
    from protos.llmserve.v1 import llmserve_pb2 as pb

    sizes = SizeLimits()
    limit = max_request_bytes(sizes, max_model_len=2048)
    params = pb.SamplingParams(max_tokens=2**32 - 1, temperature=1.0, top_p=1.0, top_k=-1,
                               seed=2**64 - 1, ignore_eos=True,
                               stop=["x" * (sizes.max_stop_bytes // sizes.max_stop_strings)]
                               * sizes.max_stop_strings,
                               stop_token_ids=[-1] * sizes.max_stop_token_ids)
    rid = "r" * MAX_REQUEST_ID_BYTES
    largest = [
        pb.GenerateRequest(text="a" * sizes.max_prompt_bytes, params=params, request_id=rid),
        pb.GenerateRequest(token_ids=pb.TokenIds(ids=[-1] * 2047), params=params, request_id=rid),
        pb.GenerateRequest(chat=pb.ChatMessages(messages=[
            pb.ChatMessage(role="", content="a" * (sizes.max_prompt_bytes // sizes.max_chat_messages))
        ] * sizes.max_chat_messages, add_generation_prompt=True), params=params, request_id=rid),
    ]
    for request in largest:
        assert request.ByteSize() <= limit
    assert limit < sizes.max_prompt_bytes + (256 << 10)  # and not much more
