"""GET /tokenizer_info, vLLM's, served only with --enable-tokenizer-info-endpoint (as vLLM gates
it: it shows the chat template and the tokenizer's configuration): the folder's
tokenizer_config.json as transformers' tokenizer holds it (init_kwargs), without file paths,
special tokens as their text, plus tokenizer_class and the chat template. Clients such as
lm-eval (its remote tokenizer reads eos_token, bos_token, pad_token and chat_template) find
the tokenizer through it."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI

from scheduler_svc.core.tokenizer import Tokenizer

_FILE_FIELDS = ("vocab_file", "merges_file", "tokenizer_file")  # paths on the server: not sent


def _plain(value):
    """A token as its text (AddedToken's serialized form is {"content": ..., ...})."""
    if isinstance(value, dict) and "content" in value:
        return value["content"]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def tokenizer_info(tokenizer: Tokenizer) -> dict:
    """vLLM's TokenizerInfo.to_dict() for the tokenizer's folder."""
    path = Path(tokenizer.folder) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for name in _FILE_FIELDS:
        config.pop(name, None)
    info = {k: _plain(v) for k, v in config.items()}
    info["tokenizer_class"] = config.get("tokenizer_class") or "PreTrainedTokenizerFast"
    if tokenizer.chat_template:  # also one from chat_template.jinja
        info["chat_template"] = tokenizer.chat_template
    return info


def add_route(app: FastAPI, tokenizer: Tokenizer) -> None:
    info = tokenizer_info(tokenizer)  # once, at start-up

    @app.get("/tokenizer_info")
    async def get_tokenizer_info():
        return info
