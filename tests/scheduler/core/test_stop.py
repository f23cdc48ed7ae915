"""Stop rules and stop-string holdback."""

from scheduler_svc.core.request import FinishReason, Request, SamplingParams
from scheduler_svc.core.stop import StopStringMatcher, process_token
from tests.scheduler.sched_driver import EOS, LetterDetokenizer


def feed_all(matcher, pieces):
    return [matcher.feed(p) for p in pieces]


def test_possible_stop_prefix_is_held_then_released():
    m = StopStringMatcher(("abc",))
    assert feed_all(m, ["xa", "b", "d"]) == [("x", ""), ("", ""), ("abd", "")]
    assert m.held_text == ""


def test_text_is_cut_before_the_stop_string_across_pieces():
    m = StopStringMatcher(("abc",))
    assert feed_all(m, ["hello a", "b", "cdef"]) == [("hello ", ""), ("", ""), ("", "abc")]
    m = StopStringMatcher(("END",))
    assert m.feed("one END two") == ("one ", "END")


def test_earliest_of_several_stop_strings_wins():
    m = StopStringMatcher(("world", "lo"))
    assert m.feed("hello world") == ("hel", "lo")
    m = StopStringMatcher(("xyz", "yz!"))
    assert feed_all(m, ["ax", "yz!"]) == [("a", ""), ("", "xyz")]


def test_nothing_streamed_is_ever_a_stop_prefix():
    stop = ("<|im_end|>", "\n\n")
    m = StopStringMatcher(stop)
    text = "line one\nline two <|im_e but not <|im_end"
    streamed = ""
    for ch in text:
        out, matched = m.feed(ch)
        assert not matched
        streamed += out
        assert not any(streamed.endswith(s[:n]) for s in stop for n in range(1, len(s)))
    assert streamed + m.flush() == text


def make(**params):
    r = Request(0, [1, 2, 3], SamplingParams(**{"max_tokens": 5, **params}))
    r.detokenizer = LetterDetokenizer()
    r.stop_matcher = StopStringMatcher(r.params.stop)
    return r


def step(r, token_id, max_model_len=100):
    r.output_token_ids.append(token_id)
    return process_token(r, token_id, (EOS,), max_model_len)


def test_eos_and_ignore_eos():
    assert step(make(), EOS) == ("", FinishReason.EOS, "")
    assert step(make(ignore_eos=True), EOS) == ("<eos>", None, "")


def test_stop_token_keeps_token_not_text_and_flushes_held_text():
    r = make(stop_token_ids=(7,), stop=("ab",))
    assert step(r, 0) == ("", None, "")  # 'a' may start "ab"
    assert step(r, 7) == ("a", FinishReason.STOP, "7")
    assert r.output_token_ids == [0, 7]


def test_max_tokens_and_context_length():
    r = make(max_tokens=2)
    assert step(r, 2) == ("c", None, "")
    assert step(r, 3) == ("d", FinishReason.LENGTH, "")
    r = make(stop=("ab",))
    assert step(r, 0, max_model_len=5) == ("", None, "")
    assert step(r, 0, max_model_len=5) == ("aa", FinishReason.LENGTH, "")  # held 'a' released


def test_stop_string_beats_length_on_the_same_token():
    r = make(max_tokens=2, stop=("ab",))
    step(r, 0)
    assert step(r, 1) == ("", FinishReason.STOP, "ab")


def test_include_stop_str_keeps_the_stop_string_and_never_retracts():
    m = StopStringMatcher(("abc",), include_stop_str=True)
    assert feed_all(m, ["hello a", "b", "cdef"]) == [("hello ", ""), ("", ""), ("abc", "abc")]
    m = StopStringMatcher(("END",), include_stop_str=True)
    assert m.feed("one END two") == ("one END", "END")
    r = make(stop=("ab",), include_stop_str_in_output=True)
    r.stop_matcher = StopStringMatcher(r.params.stop, r.params.include_stop_str_in_output)
    assert step(r, 2) == ("c", None, "")
    assert step(r, 0) == ("", None, "")  # 'a' held: it may start "ab"
    assert step(r, 1) == ("ab", FinishReason.STOP, "ab")


# --- min_tokens (vLLM's rule: no stop condition before min_tokens tokens, length still ends) ---

def test_min_tokens_ignores_eos_and_stop_token_ids_until_reached():
    r = make(min_tokens=2, stop_token_ids=(7,))
    assert step(r, EOS) == ("<eos>", None, "")  # token 1 of 2: EOS is just a token
    assert step(r, 7) == ("", FinishReason.STOP, "7")  # token 2: min_tokens reached
    r = make(min_tokens=3)
    assert [step(r, t)[1] for t in (7, EOS, EOS)] == [None, None, FinishReason.EOS]


def test_min_tokens_ignores_stop_strings_until_reached_and_still_holds_their_prefixes():
    r = make(min_tokens=3, stop=("ab",))
    assert step(r, 0) == ("", None, "")  # 'a' is held: it may start "ab"
    assert step(r, 1) == ("ab", None, "")  # "ab" before min_tokens: streamed as text
    assert step(r, 0) == ("", None, "")  # token 3: 'a' held again ...
    assert step(r, 1) == ("", FinishReason.STOP, "ab")  # ... and "ab" now ends the request


def test_min_tokens_does_not_hold_off_length():
    r = make(max_tokens=2, min_tokens=2)
    assert step(r, EOS)[1] is None
    assert step(r, 3) == ("d", FinishReason.LENGTH, "")
    r = make(min_tokens=5)
    assert step(r, 2, max_model_len=4) == ("c", FinishReason.LENGTH, "")  # the context is full


def test_sampler_params_carry_the_processors_and_the_min_tokens_stop_ids():
    p = SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(7, EOS), seed=3, logprobs=0,
                       prompt_logprobs=4, presence_penalty=0.5, frequency_penalty=-0.5,
                       repetition_penalty=1.2, min_p=0.1, logit_bias=((3, 1.5),))
    s = p.sampler_params((EOS, 28))
    assert s.min_tokens_stop_ids == (EOS, 28, 7)  # EOS ids first, each once
    assert (s.min_tokens, s.logprobs, s.prompt_logprobs, s.seed) == (2, 0, 4, 3)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty, s.min_p, s.logit_bias) == (
        0.5, -0.5, 1.2, 0.1, ((3, 1.5),))
    assert SamplingParams(max_tokens=5, min_tokens=2, ignore_eos=True,
                          stop_token_ids=(7,)).sampler_params((EOS,)).min_tokens_stop_ids == (7,)
    off = SamplingParams(max_tokens=5, stop_token_ids=(7,)).sampler_params((EOS,))
    assert (off.min_tokens_stop_ids, off.logprobs, off.prompt_logprobs, off.repetition_penalty) == ((), -1, -1, 1.0)
    assert not off.uses_processors
    assert SamplingParams(max_tokens=5, logprobs=6).sampler_params().logprobs == 6
