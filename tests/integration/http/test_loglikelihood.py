"""Loglikelihoods over HTTP (issue 25, part 3): echo with logprobs, max_tokens 0, vLLM's
prompt_logprobs, several prompts in one request; every prompt token's logprob checked against
transformers on the same weights (fp32, CPU) within 1e-4. lm-eval's local-completions request
is reproduced exactly (lm_eval/models/openai_completions.py) and, where lm-eval is installed,
driven through lm-eval itself (test_lm_eval_harness.py)."""

import json
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from scheduler_svc.core.tokenizer import Tokenizer  # noqa: E402
from tests.integration.http.conftest import API_KEY  # noqa: E402
from tests.integration.http.test_openai_http import _status, _wait_idle  # noqa: E402

TOL = 1e-4
PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [1, 7, 300, 8, 200, 9]]


@pytest.fixture(scope="module")
def reference(model_folder):
    """log_softmax of transformers' logits for a prompt: [len(ids), vocab] float64."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32).eval()

    def logprobs(ids: list[int]):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].double()
        return torch.log_softmax(logits, dim=-1)

    return logprobs


@pytest.fixture(scope="module")
def tokenizer(model_folder):
    return Tokenizer(model_folder)


def _text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _check_prompt_part(lp, ids, ref, tokenizer, k: int) -> None:
    """The echoed prompt positions of a completions logprobs object against transformers."""
    texts = [_text(tokenizer, t) for t in ids]
    assert lp.tokens[:len(ids)] == texts
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(ids))]
    assert lp.text_offset[:len(ids)] == offsets
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - ref[i - 1, ids[i]].item()) < TOL, i
        top = ref[i - 1].topk(k)
        expected = {texts[i]: ref[i - 1, ids[i]].item()}  # its own, then the k likeliest by text
        for v, t in zip(top.values.tolist(), top.indices.tolist()):
            expected.setdefault(_text(tokenizer, t), v)
        assert lp.top_logprobs[i].keys() == expected.keys()
        assert all(abs(lp.top_logprobs[i][s] - v) < TOL for s, v in expected.items())


def test_echo_with_max_tokens_0_gives_every_prompt_token_s_logprob(client, model_name, reference,
                                                                   tokenizer):
    r = client.completions.create(model=model_name, prompt=PROMPTS, echo=True, logprobs=2,
                                  max_tokens=0, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for c, ids in zip(r.choices, PROMPTS):
        ref = reference(ids)
        assert len(c.logprobs.tokens) == len(ids)  # the prompt only: nothing generated
        _check_prompt_part(c.logprobs, ids, ref, tokenizer, 2)
        assert c.text == tokenizer.decode(ids, skip_special_tokens=False)
        assert c.finish_reason == "length"
        plp = c.model_extra["prompt_logprobs"]  # vLLM's shape, by token id
        assert plp[0] is None and len(plp) == len(ids)
        for i in range(1, len(ids)):
            mine = plp[i][str(ids[i])]
            assert abs(mine["logprob"] - ref[i - 1, ids[i]].item()) < TOL
            assert mine["decoded_token"] == _text(tokenizer, ids[i]) and mine["rank"] >= 1
            top = ref[i - 1].topk(2).indices.tolist()
            assert [plp[i][str(t)]["rank"] for t in top] == [1, 2]
    assert r.usage.prompt_tokens == sum(map(len, PROMPTS)) and r.usage.completion_tokens == 0


def test_a_list_of_prompts_is_indexed_prompt_major(client, model_name, tokenizer):
    prompts = ["the quick brown fox", "hello world, hello"]
    r = client.completions.create(model=model_name, prompt=prompts, n=2, echo=True, logprobs=1,
                                  max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]  # prompt i, sample j: i * n + j
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt)
        alone = client.completions.create(model=model_name, prompt=prompt, max_tokens=3,
                                          temperature=0, extra_body={"ignore_eos": True})
        for c in r.choices[2 * i:2 * i + 2]:
            assert c.text == prompt + alone.choices[0].text
            assert c.logprobs.tokens[:len(ids)] == [_text(tokenizer, t) for t in ids]
            assert len(c.logprobs.tokens) == len(ids) + 3 and c.logprobs.token_logprobs[0] is None
    lens = [len(tokenizer.encode(p)) for p in prompts]
    assert r.usage.prompt_tokens == sum(lens) and r.usage.completion_tokens == 12


def test_echo_streams_the_prompt_ahead_of_each_choice(client, model_name):
    kwargs = dict(model=model_name, prompt=[PROMPTS[1], PROMPTS[0]], n=2, echo=True, logprobs=1,
                  max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    texts, tokens, logprobs = {}, {}, {}
    for chunk in client.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens[c.index] = tokens.get(c.index, []) + c.logprobs.tokens
            logprobs[c.index] = logprobs.get(c.index, []) + c.logprobs.token_logprobs
    assert sorted(texts) == [0, 1, 2, 3]
    for c in whole.choices:
        assert texts[c.index] == c.text and tokens[c.index] == c.logprobs.tokens
        assert logprobs[c.index][0] is None
        assert logprobs[c.index][1:] == pytest.approx(c.logprobs.token_logprobs[1:], abs=TOL)


def test_leaving_a_stream_of_several_prompts_aborts_them_all(cluster, client, model_name):
    stream = client.completions.create(model=model_name, prompt=PROMPTS, n=2, max_tokens=1500,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 8:
            break
    assert _status(cluster).num_running == 4  # 2 prompts x 2 samples
    stream.close()
    s = _wait_idle(cluster)
    assert s.num_running == 0 and s.free_blocks == s.total_blocks


def test_chat_prompt_logprobs_are_top_level(cluster, client, model_name, reference):
    messages = [{"role": "user", "content": "hello there"}]
    r = client.chat.completions.create(model=model_name, messages=messages, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 1})
    ids = _post(cluster, "/tokenize", {"messages": messages})["tokens"]
    plp, ref = r.model_extra["prompt_logprobs"], reference(ids)
    assert len(plp) == len(ids) == r.usage.prompt_tokens and plp[0] is None
    for i in range(1, len(ids)):
        assert abs(plp[i][str(ids[i])]["logprob"] - ref[i - 1, ids[i]].item()) < TOL
        assert plp[i][str(ref[i - 1].argmax().item())]["rank"] == 1


def _post(cluster, path, body):
    req = urllib.request.Request(cluster.http_url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_lm_eval_s_loglikelihood_request(cluster, model_name, reference):
    """lm-eval's local-completions loglikelihood payload and parse_logprobs, verbatim: context +
    continuation token ids, max_tokens 1, logprobs 1, echo; it sums token_logprobs[ctxlen:-1]."""
    contexts, continuations = [[1, 40, 41, 42], [1, 7, 300]], [[43, 44], [8]]
    payload = {"model": model_name, "prompt": [c + x for c, x in zip(contexts, continuations)],
               "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    out = _post(cluster, "/v1/completions", payload)
    for choice, ctx, cont in zip(sorted(out["choices"], key=lambda c: c["index"]), contexts, continuations):
        ctxlen = len(ctx)
        token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        ids = ctx + cont
        ref = reference(ids)
        expected = sum(ref[i - 1, ids[i]].item() for i in range(ctxlen, len(ids)))
        assert len(token_logprobs) == len(cont) and abs(sum(token_logprobs) - expected) < TOL
        greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
        assert greedy == all(ref[i - 1].argmax().item() == ids[i] for i in range(ctxlen, len(ids)))
        assert len(choice["logprobs"]["tokens"]) == len(ids) + 1  # and the one generated token


@pytest.mark.parametrize("body, param", [
    ({"prompt_logprobs": -1}, "prompt_logprobs"), ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": 1.5}, "prompt_logprobs"), ({"prompt_logprobs": [1]}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"echo": True, "logprobs": 21}, "logprobs"), ({"echo": 2}, "echo"),
    ({"echo": True, "max_tokens": 0, "min_tokens": 1}, "min_tokens"),
    ({"max_tokens": 0}, "max_tokens"),  # without echo, 0 is still refused
    ({"prompt": ["a"] * 129}, "prompt"), ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": [[1, 2], [99999]]}, "prompt"), ({"prompt": [[1], "a"]}, "prompt"),
])
def test_bad_fields_are_400_naming_them(cluster, body, param):
    req = urllib.request.Request(
        cluster.http_url + "/v1/completions",
        data=json.dumps({"prompt": "hi", "max_tokens": 1, **body}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    error = json.loads(e.value.read())["error"]
    assert e.value.code == 400 and error["param"].split(".")[0] == param, error
    assert error["type"] == "invalid_request_error" and param in error["message"]
