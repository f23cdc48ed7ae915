"""What a client asked to complete, as the API process sees it before tokenization (no grpc)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TextPrompt:
    """Plain text, tokenized with the tokenizer's special tokens (BOS) unless told otherwise."""

    text: str
    add_special_tokens: bool = True


@dataclass(frozen=True)
class TokenIdsPrompt:
    """Token ids given directly; `ids` may be the wire's repeated field (not copied until
    its length and values have been checked)."""

    ids: Sequence[int]


class ChatTurn(Protocol):
    """One chat message: a wire ChatMessage, or any object with these two fields."""

    role: str
    content: str


@dataclass(frozen=True)
class ChatPrompt:
    """Chat turns rendered with the model's template; the template writes the special tokens.
    `messages` may be the wire's repeated field: building a million dicts from a hostile
    request would take seconds, so they are built only after the count has been checked."""

    messages: Sequence[ChatTurn]
    add_generation_prompt: bool = True

    def as_dicts(self) -> list[dict[str, str]]:
        """The messages as a chat template reads them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def render(self, tokenizer) -> str:
        """The chat as the template writes it (a chat with tools: api/tools/render.py)."""
        return tokenizer.render_chat(self.as_dicts(), self.add_generation_prompt)


Prompt = TextPrompt | TokenIdsPrompt | ChatPrompt


def utf8_len(text: str) -> int:
    """UTF-8 bytes of `text`, without encoding it when ASCII (the common case, O(1))."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
