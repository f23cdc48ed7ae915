"""lm-eval's own local-completions model (lm_eval/models/openai_completions.py) against the
shared cluster: it finds the remote tokenizer through /tokenizer_info and /tokenize, sends its
loglikelihood batches (token ids, echo, logprobs 1, max_tokens 1) and parses them itself. Its
results must equal transformers' on the same weights. lm-eval is large (datasets, pandas,
pyarrow, scikit-learn: ~500 MB), so it is not a dev dependency: without it the test is skipped,
and test_loglikelihood.py reproduces its request and parsing instead."""

import pytest

from tests.integration.http.conftest import API_KEY

lm_eval_models = pytest.importorskip("lm_eval.models.openai_completions")
for _module in ("aiohttp", "tenacity", "requests"):  # lm-eval[api]: its API models need them
    pytest.importorskip(_module)
from lm_eval.api.instance import Instance  # noqa: E402

from scheduler_svc.core.tokenizer import Tokenizer  # noqa: E402
from tests.integration.http.test_loglikelihood import TOL, reference  # noqa: E402, F401

PAIRS = [("The quick brown", " fox jumps"), ("Hello, world", "!"), ("Serving language", " models is")]


def test_lm_eval_loglikelihood_end_to_end(cluster, model_name, model_folder, reference, monkeypatch):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)  # what local-completions sends as its bearer token
    lm = lm_eval_models.LocalCompletionsAPI(base_url=cluster.http_url + "/v1/completions", model=model_name,
                                            tokenizer_backend="auto", auth_token=API_KEY, batch_size=2)
    assert lm.tokenizer_backend == "remote"  # found through /tokenizer_info
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
    results = lm.loglikelihood(requests, disable_tqdm=True)
    tokenizer = Tokenizer(model_folder)
    for (context, continuation), (logprob, greedy) in zip(PAIRS, results):
        ids = tokenizer.encode(context + continuation, add_special_tokens=False)
        ctxlen = len(tokenizer.encode(context, add_special_tokens=False))
        ref = reference(ids)
        positions = range(ctxlen, len(ids))
        assert abs(logprob - sum(ref[i - 1, ids[i]].item() for i in positions)) < TOL
        assert greedy == all(ref[i - 1].argmax().item() == ids[i] for i in positions)
