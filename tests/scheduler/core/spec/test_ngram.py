"""The incremental n-gram proposer (NgramIndex) against the plain scan it replaced (kept here as
the reference): the same drafts on many random token sequences, repetitive ones included, both
at once (propose_ngram) and as a request grows by a few tokens a step (SpecDecoder's use); and
a micro-benchmark of the per-step cost at a 4,000-token context (printed, not asserted)."""

from __future__ import annotations

import random
import time

from llmserve.speculative import SpecDecodeConfig
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.spec.decoder import SpecDecoder
from scheduler_svc.core.spec.ngram import NgramIndex, propose_ngram


def reference_propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The original proposer: a scan of the whole context per call."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        last = suffix[-1]
        for end in range(length - 2, n - 2, -1):  # end: the last index of a candidate match
            if tokens[end] == last and tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


def random_tokens(rng: random.Random, length: int) -> list[int]:
    """Uniform over a tiny or a large vocabulary, or motifs repeated with mutations."""
    kind = rng.randrange(3)
    if kind == 0:
        return [rng.randrange(rng.choice([1, 2, 3, 5])) for _ in range(length)]
    if kind == 1:
        return [rng.randrange(50_000) for _ in range(length)]
    motifs = [[rng.randrange(20) for _ in range(rng.randint(1, 7))] for _ in range(3)]
    out: list[int] = []
    while len(out) < length:
        out += rng.choice(motifs) if rng.random() < 0.8 else [rng.randrange(20)]
    return out[:length]


def bounds(rng: random.Random) -> tuple[int, int, int]:
    lo = rng.randint(1, 4)
    return lo, lo + rng.randint(-1, 3), rng.randint(0, 6)  # max_n < min_n: never a proposal


def test_same_drafts_as_the_scan_on_whole_sequences():
    rng = random.Random(0)
    checked = found = 0
    for _ in range(3000):
        tokens = random_tokens(rng, rng.randint(0, 60))
        lo, hi, k = bounds(rng)
        want = reference_propose_ngram(tokens, lo, hi, k)
        assert propose_ngram(tokens, lo, hi, k) == want, (tokens, lo, hi, k)
        checked, found = checked + 1, found + bool(want)
    assert found > checked // 5  # the repetitive sequences do propose (k = 0 never does)


def test_same_drafts_as_the_scan_while_a_request_grows():
    """One index per request, fed as the scheduler feeds it: the prompt, then 1..5 tokens a
    step (a verify step's accepted drafts and one more), k varying with the budget."""
    rng = random.Random(1)
    for case in range(300):
        tokens = random_tokens(rng, rng.randint(1, 200))
        lo, hi, _ = bounds(rng)
        prompt_len = rng.randint(1, len(tokens))
        request = Request(case, tokens[:prompt_len], SamplingParams(max_tokens=1000))
        index = NgramIndex(lo, hi)
        length = prompt_len
        while True:
            k = rng.randint(0, 6)
            got = index.propose(request.token_ids_between, request.num_tokens, k)
            assert got == reference_propose_ngram(tokens[:length], lo, hi, k), (case, length)
            if length == len(tokens):
                break
            step = min(rng.randint(1, 5), len(tokens) - length)
            request.output_token_ids += tokens[length:length + step]
            length += step


def test_spec_decoder_proposes_from_the_request_index():
    request = Request(0, [1, 2, 3, 9, 1, 2], SamplingParams(max_tokens=50))
    request.num_computed_tokens = request.num_tokens - 1
    decoder = SpecDecoder(SpecDecodeConfig("ngram", 3, 4, 2), max_model_len=100, eos_token_ids=(0,))
    assert decoder.propose(request, budget=8) == [3, 9, 1]
    assert request.ngram_index is not None and request.ngram_index.num_indexed == 5
    request.output_token_ids += [3, 9]  # now ... 1 2 3 9: the 4-gram [1, 2, 3, 9] matches
    request.num_computed_tokens = request.num_tokens - 1
    assert decoder.propose(request, budget=8) == [1, 2, 3]


def _per_call_us(fn, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def test_micro_benchmark_4000_token_context(capsys):
    """Per-step cost of a proposal at a 4,000-token context (min 2, max 4, k 4): the scan vs
    the index (steady state: one new token a step; and the first call, indexing the prompt).
    Printed only: no timed assertion."""
    rng = random.Random(2)
    text = [rng.randrange(32_000) for _ in range(4000)]  # no repeats: the scan's worst case
    echo = text[:3000] + text[1000:2000]  # the last 1,000 tokens repeat a passage
    lines = []
    for name, tokens in (("no match", text), ("repetitive", echo)):
        scan = _per_call_us(lambda t=tokens: reference_propose_ngram(t, 2, 4, 4), 20)
        first = _per_call_us(lambda t=tokens: propose_ngram(t, 2, 4, 4), 20)
        request = Request(0, tokens[:-200], SamplingParams(max_tokens=1000))
        index = NgramIndex(2, 4)
        index.propose(request.token_ids_between, request.num_tokens, 4)
        t = time.perf_counter()
        for token in tokens[-200:]:  # 200 steps of one token each, ending at 4,000 tokens
            request.output_token_ids.append(token)
            drafts = index.propose(request.token_ids_between, request.num_tokens, 4)
        step = (time.perf_counter() - t) / 200 * 1e6
        assert drafts == reference_propose_ngram(tokens, 2, 4, 4)
        lines.append(f"ngram proposer, 4,000-token context, {name}: scan {scan:,.0f} us/step, "
                     f"index {step:.1f} us/step ({scan / step:,.0f}x), first call (indexing) {first:,.0f} us")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
