"""Incremental detokenization: text per sampled token, never a broken UTF-8 sequence."""

from __future__ import annotations

from collections.abc import Callable

from tokenizers.decoders import DecodeStream

from .request import Request
from .tokenizer import Tokenizer

# Prompt tokens fed first so the first output token decodes in context (a leading space of a
# SentencePiece token, a character split across the prompt's end).
NUM_PROMPT_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Decodes one request's output tokens as they arrive, with tokenizers' DecodeStream.

    DecodeStream holds tokens back until they form complete characters. Ids the tokenizer
    does not know (the model's vocabulary padded past the tokenizer's) produce no text.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        for token_id in prompt_token_ids[-NUM_PROMPT_CONTEXT_TOKENS:]:
            self.step(token_id)  # context only: its text was the client's own

    def step(self, token_id: int) -> str:
        """The text that token_id completes ("" while a character is still incomplete)."""
        if self.tokenizer.id_to_token(token_id) is None:
            return ""
        try:
            return self.stream.step(self.tokenizer.hf, token_id) or ""
        except Exception:
            # The stream cannot continue from its held prefix: start over from this token.
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self.tokenizer.hf, token_id) or ""


def detokenizer_factory(tokenizer: Tokenizer) -> Callable[[Request], IncrementalDetokenizer]:
    """What Scheduler(config, detokenizer_factory=...) takes: one detokenizer per request."""
    return lambda request: IncrementalDetokenizer(tokenizer, request.prompt_token_ids)
