"""Checks of issue 28 (the same request gives the same answer) through both services, shared by
the CPU and CUDA integration tests and the GPU suite's `det` section: a request's tokens and
logprobs alone, among random others, and the scheduler's counters that show a condition was
met (preemptions, drafts).

    answer(stub, prompt, kind)                    -> (token ids, [(logprob, top-2)] per token)
    with_others(stub, prompt, n, kind, seed, ...) -> the prompt's answer among n random others
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import time
import urllib.request

KINDS = {"greedy": dict(temperature=0.0), "seeded": dict(temperature=1.0, seed=1234)}

# held-out style requests (chat and edit), none of them in benchmarks/real_model.PROMPTS
HELD_OUT = [
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Fix the grammar: 'She don't like apples and she go to school yesterday.'",
    "Rewrite this sentence to be more formal: 'Hey, can you send me that file real quick?'",
    "What are the three states of matter?",
    "Write a short email declining a meeting invitation politely.",
    "Convert 72 degrees Fahrenheit to Celsius and show the steps.",
    "Rename the variable x to total in: x = 0\nfor v in values:\n    x += v\nprint(x)",
    "Give a one-line definition of photosynthesis.",
    "Make this list alphabetical: pear, apple, mango, banana, cherry.",
    "Explain recursion to a ten-year-old in three sentences.",
    "Shorten this: 'In the event that it rains tomorrow, the picnic will be moved indoors.'",
    "Name four planets of the solar system and one fact about each.",
]


def answer(stub, prompt: list[int], kind: str, max_tokens: int, logprobs: bool = True, timeout: float = 300):
    """(token ids, [(logprob, top-2 (id, logprob))] per token) of one streamed request
    (ignore_eos: every answer has max_tokens tokens); without logprobs, ([ids], [])."""
    from protos.llmserve.v1 import llmserve_pb2 as pb

    extra = dict(logprobs=True, top_logprobs=2) if logprobs else {}
    req = pb.GenerateRequest(params=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra,
                                                      **KINDS[kind]))
    req.token_ids.ids.extend(prompt)
    ids, lps = [], []
    for msg in stub.Generate(req, timeout=timeout):
        ids += msg.token_ids
        lps += [(lp.logprob, [(t.token_id, t.logprob) for t in lp.top_logprobs]) for lp in msg.logprobs]
    return ids, lps


def with_others(stub, prompt: list[int], num_others: int, kind: str, seed: int, max_tokens: int,
                vocab: int = 500, logprobs: bool = True, last: bool = False):
    """`prompt` among num_others random requests (random lengths, greedy or seeded), sent at
    once -> its answer. last: it is sent after the others are under way, so it is the newest
    (the first a full KV cache preempts)."""
    rng = random.Random(seed)
    others = [[rng.randrange(1, vocab) for _ in range(rng.randint(3, 90))] for _ in range(num_others)]
    lengths = [rng.randint(1, 60) for _ in others]
    kinds = [rng.choice(list(KINDS)) for _ in others]
    with cf.ThreadPoolExecutor(num_others + 1) as pool:
        futures = [pool.submit(answer, stub, p, k, n, logprobs) for p, k, n in zip(others, kinds, lengths)]
        if last:
            time.sleep(0.3)
        target = pool.submit(answer, stub, prompt, kind, max_tokens, logprobs)
        for f in futures:
            f.result()
        return target.result()


def counters(metrics_port: int) -> dict[str, float]:
    """The scheduler's Prometheus counters (llmserve:*_total), summed over their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return {f"{family.name}_total": sum(s.value for s in family.samples if s.name.endswith("_total"))
            for family in text_string_to_metric_families(text) if family.type == "counter"}
