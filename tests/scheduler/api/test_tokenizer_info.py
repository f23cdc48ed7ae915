"""GET /tokenizer_info only with --enable-tokenizer-info-endpoint (vLLM's gate), its shape for a
tokenizer_config.json with transformers' serialized special tokens and file paths, and the flag
on both command lines."""

import json

from starlette.testclient import TestClient

from llmserve.flags import commands, parse_args
from scheduler_svc.api.http.app import build_app
from scheduler_svc.api.http.context import HttpContext
from scheduler_svc.api.http.tokenizer_info import tokenizer_info
from scheduler_svc.config import from_args
from scheduler_svc.core.tokenizer import Tokenizer


class _Admission:  # what build_app reads of it
    engine = limits = pool = None


def _app(tok, enabled: bool) -> TestClient:
    return TestClient(build_app(HttpContext(_Admission(), tok, "tiny", enable_tokenizer_info_endpoint=enabled),
                                1 << 20))


def test_the_route_is_off_by_default_and_404(tok):
    r = _app(tok, False).get("/tokenizer_info")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert _app(tok, True).get("/tokenizer_info").json()["eos_token"] == "<|eos|>"


def test_paths_are_dropped_and_added_tokens_are_their_text(tok, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tok.folder / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(vocab_file="/srv/m/vocab.json", merges_file="/srv/m/merges.txt",
                  tokenizer_file="/srv/m/tokenizer.json", tokenizer_class="LlamaTokenizerFast",
                  pad_token={"__type": "AddedToken", "content": "<|end|>", "lstrip": False},
                  added_tokens_decoder={"2": {"content": "<|end|>", "special": True}})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    info = tokenizer_info(Tokenizer(tmp_path))
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & info.keys()
    assert info["pad_token"] == "<|end|>" and info["added_tokens_decoder"] == {"2": "<|end|>"}
    assert info["tokenizer_class"] == "LlamaTokenizerFast" and info["bos_token"] == "<|bos|>"


def test_the_flag_on_the_scheduler_and_the_launcher():
    assert not from_args([]).enable_tokenizer_info_endpoint
    assert from_args(["--enable-tokenizer-info-endpoint"]).enable_tokenizer_info_endpoint
    _, scheduler = commands(parse_args(["--enable-tokenizer-info-endpoint"]), http_api=True)
    assert scheduler[-1] == "--enable-tokenizer-info-endpoint"
    assert "--enable-tokenizer-info-endpoint" not in commands(parse_args([]), http_api=True)[1]
