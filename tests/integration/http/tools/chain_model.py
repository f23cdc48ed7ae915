"""A tiny model whose greedy output is a known text, whatever the chat: the tiny random Llama
with its layers silenced (o_proj and down_proj zero, so the last hidden state is the last
token's embedding) and its padding tokens renamed to the text's pieces. The prompt's last token
(the template's "<|assistant|>\\n") is embedded as e_0, piece i as e_i, and the output head maps
e_i to piece i+1 (the last piece to EOS): the served model writes the pieces, one token each,
then stops, through the real executor, scheduler and detokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from executor_svc.model_loader.random_model import build_random_model
from scheduler_svc.core.tokenizer import Tokenizer

SCALE = 4.0  # the chosen token's logit: 4 * sqrt(64) = 32; every other one is 0


def build_chain_model(folder: Path, pieces: list[str]) -> Path:
    folder = build_random_model(folder, "tiny-llama", seed=0)
    spec = json.loads((folder / "tokenizer.json").read_text())
    # random_model keeps its last padding ids as added tokens "<|x0|>", ...: they become the pieces
    padding = [token for token in spec["added_tokens"] if token["content"].startswith("<|x")]
    assert len(pieces) <= len(padding)
    ids = [token["id"] for token in padding[:len(pieces)]]
    for token, piece in zip(padding, pieces):
        token["content"] = piece
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    tok = Tokenizer(folder)
    start = tok.apply_chat_template([{"role": "user", "content": "hi"}])[-1]
    assert start not in ids and tok.decode(ids) == "".join(pieces)
    weights_file = folder / "model.safetensors"
    weights = load_file(str(weights_file))
    hidden = weights["model.embed_tokens.weight"].shape[1]
    assert len(pieces) < hidden
    for name, w in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w.zero_()
    weights["model.norm.weight"].fill_(1.0)
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    head.zero_()
    for i, token in enumerate([start, *ids]):
        embed[token] = torch.nn.functional.one_hot(torch.tensor(i), hidden).float()
        following = ids[i] if i < len(ids) else tok.eos_token_ids[0]
        head[following, i] = SCALE
    save_file(weights, str(weights_file))
    return folder
