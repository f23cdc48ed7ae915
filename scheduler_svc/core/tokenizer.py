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
        self.folder = folder = Path(folder)
        self.hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        config = _read_json(folder / "tokenizer_config.json")
        self.special_tokens = {name: _token_text(config.get(name)) for name in
                               ("bos_token", "eos_token", "unk_token", "pad_token")}
        self.bos_token_id = self._id_of(self.special_tokens["bos_token"])
        self.eos_token_ids = self._eos_token_ids(_read_json(folder / "generation_config.json"))
        self.chat_template = _find_chat_template(folder, config)
        self._compiled_template: jinja2.Template | None = None
        # The most bytes of text one token can stand for: a text of B bytes has at least
        # ceil(B / max_token_bytes) tokens (api/tokenize_pool.py refuses on it untokenized).
        self.max_token_bytes = max_token_bytes(self.hf, _read_json(folder / "tokenizer.json"))

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


# Normalizers that never make the text shorter in UTF-8 bytes (Replace: when its content is at
# least as long as its pattern). NFC composes at most 3 code points into one of at least a third
# of their bytes (Hangul L+V+T: 9 bytes -> 3): a token then stands for up to 3x its bytes.
_KEEPS_LENGTH = {"Prepend": 1, "Replace": 1, "NFC": 3}
# Pre-tokenizers that keep every byte of the text (Whitespace, Bert... drop the whitespace).
_KEEPS_BYTES = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts", "Split"}


def max_token_bytes(hf: HFTokenizer, spec: dict) -> int | None:
    """The most UTF-8 bytes of input one token can stand for, from the vocabulary's longest
    token (its text in the vocabulary is never shorter than the input it matched: byte-level
    characters are 1-2 bytes for one byte, SentencePiece's '▁' 3 for one space, '<0xAB>' 6 for
    one). None when no bound holds: a normalizer or pre-tokenizer that drops or shrinks text,
    or an unknown token that may stand for a whole run of text."""
    factor = _length_factor(spec.get("normalizer"), _KEEPS_LENGTH)
    if factor is None or _length_factor(spec.get("pre_tokenizer"), {t: 1 for t in _KEEPS_BYTES}) is None:
        return None
    model = spec.get("model") or {}
    unknown = 0  # bytes an unknown token may stand for
    if model.get("type") == "WordPiece":
        unknown = 4 * model.get("max_input_chars_per_word", 100)
    elif model.get("type") != "BPE" or (model.get("unk_token") is not None and not model.get(
            "byte_fallback") and model.get("fuse_unk")):
        return None  # Unigram, WordLevel, fused unknowns: one token for a whole run
    elif model.get("unk_token") is not None:
        unknown = 4  # one character
    longest = max((len(t.encode("utf-8", "surrogatepass")) for t in hf.get_vocab(True)), default=1)
    return factor * max(longest, unknown, 1)


def _length_factor(step: dict | None, allowed: dict[str, int]) -> int | None:
    """How many times shorter a normalizer (or pre-tokenizer) can make the text; None: unbounded."""
    if step is None:
        return 1
    kind = step.get("type")
    if kind == "Sequence":
        factor = 1
        for part in step.get("normalizers") or step.get("pretokenizers") or []:
            f = _length_factor(part, allowed)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":
        pattern = (step.get("pattern") or {}).get("String")
        if pattern is None or len(step.get("content", "").encode()) < len(pattern.encode()):
            return None
    if kind == "Split" and str(step.get("behavior", "")).lower() == "removed":
        return None
    return allowed.get(kind)


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
