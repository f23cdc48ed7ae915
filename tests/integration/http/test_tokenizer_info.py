"""vLLM's GET /tokenizer_info (the shared cluster has --enable-tokenizer-info-endpoint) and the
model card's root and max_model_len (issue 25, part 5)."""

import json
import urllib.request

from executor_svc.model_loader.random_model import BOS, CHAT_TEMPLATE, EOS
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.http.conftest import API_KEY, AUTH


def _get(cluster, path):
    req = urllib.request.Request(cluster.http_url + path, headers={"authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_tokenizer_info_is_the_tokenizer_config_as_vllm_sends_it(cluster, model_folder):
    info = _get(cluster, "/tokenizer_info")
    config = json.loads((model_folder / "tokenizer_config.json").read_text())
    assert info == {**config, "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    assert info["eos_token"] == EOS and info["bos_token"] == BOS  # what lm-eval's remote tokenizer reads


def test_models_report_root_and_max_model_len(cluster, model_name):
    info = cluster.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=AUTH)
    card = _get(cluster, "/v1/models")["data"][0]
    assert (card["id"], card["root"], card["max_model_len"]) == (model_name, model_name, info.max_model_len)
