"""A Hugging Face tokenizer folder, loaded with the `tokenizers` library and jinja2 alone.

transformers is not imported: it imports torch, which the scheduler image does not have.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    """Encodes, decodes and renders chat templates like transformers' fast tokenizer does.

    Reads tokenizer.json (BOS insertion comes from its post-processor), tokenizer_config.json
    (special tokens, chat template) and generation_config.json (more EOS ids).
    """

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        config = _read_json(folder / "tokenizer_config.json")
        self.special_tokens = {name: _token_text(config.get(name)) for name in
                               ("bos_token", "eos_token", "unk_token", "pad_token")}
        self.bos_token_id = self._id_of(self.special_tokens["bos_token"])
        self.eos_token_ids = self._eos_token_ids(_read_json(folder / "generation_config.json"))
        self.chat_template = _find_chat_template(folder, config)
        self._compiled_template: jinja2.Template | None = None

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> Tokenizer:
        """The name transformers uses; a local folder only (nothing is downloaded)."""
        return cls(folder)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    **kwargs: Any) -> str:
        """The chat template rendered to text (transformers' render_jinja_template)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self.chat_template)
        variables = {name: text for name, text in self.special_tokens.items() if text is not None}
        variables.update(kwargs)
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs: Any) -> list[int]:
        """Token ids of the rendered chat; the template writes its own special tokens."""
        text = self.render_chat(messages, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.hf.token_to_id(token)

    def _eos_token_ids(self, generation_config: dict) -> tuple[int, ...]:
        ids = generation_config.get("eos_token_id")
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        eos_id = self._id_of(self.special_tokens["eos_token"])
        if eos_id is not None and eos_id not in ids:
            ids.append(eos_id)
        return tuple(ids)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(token: str | dict | None) -> str | None:
    """A special token as written in tokenizer_config.json: text or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def _find_chat_template(folder: Path, config: dict) -> str | None:
    """tokenizer_config.json's template (text or named list), else chat_template.jinja/.json."""
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}.get("default")
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    if template is None:
        template = _read_json(folder / "chat_template.json").get("chat_template")
    return template


def _compile_template(template: str) -> jinja2.Template:
    """The same sandboxed environment transformers renders chat templates in."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        # jinja's own tojson escapes HTML characters, which chat templates do not want.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
