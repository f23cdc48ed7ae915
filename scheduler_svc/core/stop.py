"""Stop rules: EOS, stop token ids, stop strings (with holdback), min_tokens, max_tokens,
context length."""

from __future__ import annotations

from .request import FinishReason, Request


class StopStringMatcher:
    """Finds stop strings in streamed text and holds back any tail that might start one.

    Text is cut before the stop string (right after it with include_stop_str); a tail that is
    a prefix of some stop string is held until it either completes the stop string or cannot
    anymore, so nothing streamed is ever retracted.
    """

    def __init__(self, stop: tuple[str, ...], include_stop_str: bool = False):
        self.stop = tuple(s for s in stop if s)
        self.include_stop_str = include_stop_str
        self.held_text = ""

    def feed(self, text: str, can_stop: bool = True) -> tuple[str, str]:
        """Adds new text; returns (text safe to stream, matched stop string or ""). With
        can_stop False (min_tokens not reached) a complete stop string is streamed as text,
        and only a tail that might start one is held."""
        if not self.stop:
            return text, ""
        buf = self.held_text + text
        matches = [(i, len(s), s) for s in self.stop if (i := buf.find(s)) >= 0] if can_stop else []
        if matches:
            index, _, matched = min(matches)
            self.held_text = ""
            end = index + len(matched) if self.include_stop_str else index
            return buf[:end], matched
        num_held = _longest_stop_prefix_suffix(buf, self.stop)
        self.held_text = buf[len(buf) - num_held:]
        return buf[:len(buf) - num_held], ""

    def flush(self) -> str:
        """Releases the held text (the request ended for another reason)."""
        text, self.held_text = self.held_text, ""
        return text


def _longest_stop_prefix_suffix(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper prefix of a stop string."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def length_reached(request: Request, max_model_len: int, num_pending_tokens: int = 0) -> bool:
    """max_tokens generated or the context full, counting num_pending_tokens not yet seen."""
    return (request.num_output_tokens + num_pending_tokens >= request.params.max_tokens
            or request.num_tokens + num_pending_tokens >= max_model_len)


def check_stop_token(request: Request, token_id: int,
                     eos_token_ids: tuple[int, ...]) -> tuple[FinishReason | None, str]:
    """Token-level stops; the token is kept in token ids but its text is not streamed."""
    if token_id in request.params.stop_token_ids:
        return FinishReason.STOP, str(token_id)
    if not request.params.ignore_eos and token_id in eos_token_ids:
        return FinishReason.EOS, ""
    return None, ""


def process_token(request: Request, token_id: int, eos_token_ids: tuple[int, ...],
                  max_model_len: int) -> tuple[str, FinishReason | None, str]:
    """Applies the stop rules to a token just appended to request.output_token_ids.

    Returns (new text to stream, finish reason or None, matched stop). On the request's last
    token, the text the detokenizer still holds is released (and may still end in a stop
    string); a stop or EOS token's own text is never streamed. Before min_tokens tokens
    (this one counted) no stop condition applies, as in vLLM: only length ends the request.
    """
    params, num_output = request.params, len(request.output_token_ids)
    can_stop = num_output >= params.min_tokens
    reason, matched = None, ""
    if can_stop:  # check_stop_token, inline (this runs for every token)
        if token_id in params.stop_token_ids:
            reason, matched = FinishReason.STOP, str(token_id)
        elif not params.ignore_eos and token_id in eos_token_ids:
            reason = FinishReason.EOS
    detokenizer = request.detokenizer
    text = detokenizer.step(token_id) if detokenizer is not None and reason is None else ""
    if reason is None and (num_output >= params.max_tokens  # length_reached, inline
                           or len(request.prompt_token_ids) + num_output >= max_model_len):
        reason = FinishReason.LENGTH
    if reason is not None and detokenizer is not None:
        text += detokenizer.flush()
    matcher = request.stop_matcher
    if not matcher.stop:  # no stop strings: feed() would hand the text back as it is
        return text, reason, matched
    text, matched_string = matcher.feed(text, can_stop)
    if matched_string:
        return text, FinishReason.STOP, matched_string
    if reason is not None:
        text += matcher.flush()  # held text was no stop string after all
    return text, reason, matched
