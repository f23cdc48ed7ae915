"""Request checks, size limits and defaults (pure functions; the integration tests check the
status codes)."""

import pytest

from scheduler_svc.api.prompts import ChatPrompt, TextPrompt, TokenIdsPrompt
from scheduler_svc.api.request_params import RawParams, build_sampling_params
from scheduler_svc.api.validation import (MAX_REQUEST_ID_BYTES, Limits, SizeLimits, check_prompt,
                                          check_prompt_size, check_request_size, max_request_bytes)
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
                               stop_token_ids=[-1] * sizes.max_stop_token_ids, n=2**32 - 1,
                               logprobs=True, top_logprobs=2**32 - 1, prompt_logprobs=2**32 - 1,
                               presence_penalty=1.0, frequency_penalty=1.0, repetition_penalty=1.0,
                               min_p=1.0, min_tokens=2**32 - 1,
                               logit_bias={-1 - i: 1.0 for i in range(300)})
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


# --- the sampling surface (issue 10): n, logprobs, penalties, min_p, logit_bias, min_tokens --------

RICH = Limits(max_model_len=2048, vocab_size=512, block_size=16, num_usable_blocks=49,
              eos_token_ids=(2,), max_logprobs=20, max_logit_bias=3, max_min_tokens_stop_ids=3)
NAN, INF = float("nan"), float("inf")


def test_sampling_surface_defaults_and_values():
    p = build_sampling_params(RawParams(max_tokens=5), 10, RICH)
    assert (p.n, p.logprobs, p.prompt_logprobs, p.presence_penalty, p.frequency_penalty,
            p.repetition_penalty, p.min_p, p.logit_bias, p.min_tokens) == (1, None, None, 0.0, 0.0, 1.0, 0.0, (), 0)
    p = build_sampling_params(RawParams(
        max_tokens=5, n=3, logprobs=True, top_logprobs=20, prompt_logprobs=0, presence_penalty=-2.0,
        frequency_penalty=2.0, repetition_penalty=0.5, min_p=1.0, logit_bias={7: -100.0, 3: 100.0},
        min_tokens=5, stop_token_ids=(4, 5)), 10, RICH)
    assert (p.n, p.logprobs, p.prompt_logprobs, p.presence_penalty, p.frequency_penalty,
            p.repetition_penalty, p.min_p, p.logit_bias, p.min_tokens) == (
        3, 20, 0, -2.0, 2.0, 0.5, 1.0, ((3, 100.0), (7, -100.0)), 5)
    assert build_sampling_params(RawParams(max_tokens=5, logprobs=True), 10, RICH).logprobs == 0


@pytest.mark.parametrize("raw,needle", [
    (RawParams(n=0), "n must be at least 1"),
    (RawParams(top_logprobs=2), "needs logprobs"),
    (RawParams(logprobs=True, top_logprobs=21), "0 to 20 alternatives"),
    (RawParams(prompt_logprobs=21), "prompt_logprobs=21"),
    (RawParams(presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
    (RawParams(presence_penalty=NAN), "presence_penalty"),
    (RawParams(frequency_penalty=-2.01), "frequency_penalty must be in [-2, 2]"),
    (RawParams(frequency_penalty=INF), "frequency_penalty"),
    (RawParams(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (RawParams(repetition_penalty=-1.0), "repetition_penalty"),
    (RawParams(repetition_penalty=INF), "repetition_penalty"),
    (RawParams(repetition_penalty=NAN), "repetition_penalty"),
    (RawParams(min_p=1.5), "min_p must be in [0, 1]"),
    (RawParams(min_p=-0.1), "min_p"),
    (RawParams(min_p=NAN), "min_p"),
    (RawParams(logit_bias={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}), "4 entries; the limit is 3"),
    (RawParams(logit_bias={512: 1.0}), "outside the vocabulary [0, 512): [512]"),
    (RawParams(logit_bias={-1: 1.0}), "outside the vocabulary"),
    (RawParams(logit_bias={5: 100.5}), "[-100, 100]"),
    (RawParams(logit_bias={5: NAN}), "[-100, 100]"),
    (RawParams(logit_bias={5: -INF}), "[-100, 100]"),
    (RawParams(min_tokens=9), "min_tokens=9 exceeds max_tokens=8"),
    (RawParams(min_tokens=1, stop_token_ids=(4, 5, 6)), "4 ids here; the executor masks at most 3"),
])
def test_sampling_surface_refusals(raw, needle):
    raw = RawParams(**{**raw.__dict__, "max_tokens": raw.max_tokens or 8})
    with pytest.raises(RequestError) as err:
        build_sampling_params(raw, 10, RICH)
    assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.message


def test_min_tokens_stop_ids_leave_eos_out_with_ignore_eos_and_count_each_id_once():
    build_sampling_params(RawParams(max_tokens=8, min_tokens=1, stop_token_ids=(4, 5, 6), ignore_eos=True), 10, RICH)
    build_sampling_params(RawParams(max_tokens=8, min_tokens=1, stop_token_ids=(2, 5, 6)), 10, RICH)
    build_sampling_params(RawParams(max_tokens=8, stop_token_ids=(4, 5, 6, 7)), 10, RICH)  # no min_tokens
    assert build_sampling_params(RawParams(min_tokens=700), 10, RICH).max_tokens == 775


def test_n_is_capped_by_max_n_before_tokenizing():
    sizes = SizeLimits(max_n=4)
    check_request_size(RawParams(n=4), "", sizes)
    for n, needle in [(5, "n=5: ask for 1 to 4 parallel samples (--max-n)"), (0, "n=0")]:
        with pytest.raises(RequestError) as err:
            check_request_size(RawParams(n=n), "", sizes)
        assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.message


def test_n_samples_must_fit_the_cache_together_sharing_the_prompt_s_full_blocks():
    # 49 blocks of 16; a 40-token prompt has 2 full blocks before its last token. 60 new tokens:
    # ceil(99 / 16) = 7 blocks a sample, 5 of its own: n samples need 7 + 5 (n - 1).
    assert build_sampling_params(RawParams(max_tokens=60, n=9), 40, RICH).n == 9  # 47 blocks
    with pytest.raises(RequestError) as err:
        build_sampling_params(RawParams(max_tokens=60, n=10), 40, RICH)  # 52
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert "52 KV blocks (10 samples of 7 KV blocks sharing 2" in err.value.message and "n" in err.value.message
    no_sharing = Limits(**{**RICH.__dict__, "prefix_caching": False})
    with pytest.raises(RequestError):  # 7 * 9 = 63 without prefix caching
        build_sampling_params(RawParams(max_tokens=60, n=9), 40, no_sharing)
    # unset max_tokens: as many as n samples leave room for
    p = build_sampling_params(RawParams(n=4), 40, RICH)  # 2 + (49 - 2) // 4 = 13 blocks a sample
    assert p.max_tokens == 13 * 16 + 1 - 40
    build_sampling_params(RawParams(max_tokens=p.max_tokens, n=4), 40, RICH)
