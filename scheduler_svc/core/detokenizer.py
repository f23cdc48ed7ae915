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
    does not know (the model's vocabulary padded past the tokenizer's) produce no text. When
    the request ends, flush() releases what is still held, so the streamed text always adds up
    to what decode() makes of the whole output.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int],
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self._hf = tokenizer.hf
        self._id_to_token = tokenizer.hf.id_to_token  # bound once: step() runs for every token
        self.skip_special_tokens = skip_special_tokens
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.context_ids = list(prompt_token_ids[-NUM_PROMPT_CONTEXT_TOKENS:])
        self.output_ids: list[int] = []  # known to the tokenizer
        self.emitted: list[str] = []  # what step() returned, for flush()
        for token_id in self.context_ids:
            self._decode_next(token_id)  # context only: its text was the client's own

    def step(self, token_id: int) -> str:
        """The text that token_id completes ("" while a character is still incomplete)."""
        if self._id_to_token(token_id) is None:
            return ""
        self.output_ids.append(token_id)
        try:  # (_decode_next, inline)
            text = self.stream.step(self._hf, token_id) or ""
        except Exception:  # noqa: BLE001 - the stream cannot continue from its held prefix
            text = self._restart(token_id)
        if text:
            self.emitted.append(text)
        return text

    def flush(self) -> str:
        """At the end of the request: the text step() still holds back (an incomplete
        character, which decode() renders as U+FFFD), as decode() of the whole output has it."""
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # noqa: E731
        context, everything = decode(self.context_ids), decode(self.context_ids + self.output_ids)
        full = everything[len(context):] if everything.startswith(context) else decode(self.output_ids)
        emitted = "".join(self.emitted)
        if not full.startswith(emitted):
            return ""  # the stream restarted somewhere: what it streamed stands
        self.emitted = [full]
        return full[len(emitted):]

    def _decode_next(self, token_id: int) -> str:
        try:
            return self.stream.step(self._hf, token_id) or ""
        except Exception:
            return self._restart(token_id)

    def _restart(self, token_id: int) -> str:
        """The stream cannot continue from its held prefix: start over from this token."""
        self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        return self.stream.step(self.tokenizer.hf, token_id) or ""


def detokenizer_factory(tokenizer: Tokenizer) -> Callable[[Request], IncrementalDetokenizer]:
    """What Scheduler(config, detokenizer_factory=...) takes: one detokenizer per request
    (anything with step(token_id) -> str and flush() -> str)."""
    return lambda request: IncrementalDetokenizer(tokenizer, request.prompt_token_ids)
