"""Prompt logprobs on the HTTP door, in vLLM's shapes: completions' `echo` (the prompt's text,
tokens and logprobs ahead of each choice's own, OpenAI's legacy logprobs shape; with
`max_tokens: 0` the prompt alone, lm-eval's loglikelihood request) and the `prompt_logprobs`
field (a list with null for the first prompt token, then {token id: {logprob, rank,
decoded_token}} per position: on each completions choice, top level on chat).

The engine sends a prompt's logprobs once, with its sample 0's first output (core/logprobs.py);
every sample of an echoed prompt needs them first, so an output that comes before them is held
back until they come."""

from __future__ import annotations

from scheduler_svc.core.outputs import LogprobColumns, LogprobEntry, RequestOutput
from scheduler_svc.core.request import FinishReason

MIN_LOGPROB = -9999.0  # what OpenAI and vLLM send for -inf (JSON has no infinity)


def _finite(logprob: float) -> float:
    return max(float(logprob), MIN_LOGPROB)


def token_logprobs(token_text, entries: list[LogprobEntry]) -> list[dict]:
    """Generated tokens' logprobs in the chat (and Responses) shape: per token its text,
    logprob, UTF-8 bytes and top_logprobs (each alternative likewise)."""

    def one(token_id: int, logprob: float) -> dict:
        s = token_text(token_id)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8", "replace"))}

    return [{**one(token_id, logprob), "top_logprobs": [one(t, lp) for t, lp in zip(top_ids, top_lps)]}
            for token_id, logprob, _rank, top_ids, top_lps in entries]


def completion_logprobs(token_text, entries: list[LogprobEntry], k: int, offset: int) -> tuple[dict, int]:
    """OpenAI's completions logprobs of entries (from text offset `offset`) and the offset
    after them. Each position's top_logprobs holds its own token and the k most likely, as
    OpenAI documents and vLLM sends (up to k + 1 entries; keyed by text, so ids that decode
    alike, such as partial UTF-8 bytes as U+FFFD, share one entry: the token's own, else the
    likelier); the first prompt token has null for both."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token_id, logprob, _rank, top_ids, top_lps in entries:
        text = token_text(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if logprob is None:
            token_logprobs.append(None)
            top.append(None)
            continue
        token_logprobs.append(_finite(logprob))
        alternatives = {text: _finite(logprob)}  # a text two ids share keeps the first's value
        for t, lp in zip(top_ids[:k], top_lps[:k]):
            alternatives.setdefault(token_text(t), _finite(lp))
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}, offset


def vllm_prompt_logprobs(token_text, columns: LogprobColumns | None, k: int) -> list | None:
    """vLLM's `prompt_logprobs`: null for the first token, then each prompt token and the k
    most likely, by token id: {"logprob", "rank", "decoded_token"}."""
    if columns is None:
        return None
    out: list = []
    for token_id, logprob, rank, top_ids, top_lps in columns.entries():
        if logprob is None:
            out.append(None)
            continue
        position = {str(token_id): {"logprob": _finite(logprob), "rank": rank,
                                    "decoded_token": token_text(token_id)}}
        for r, (t, lp) in enumerate(zip(top_ids[:k], top_lps[:k]), 1):
            position.setdefault(str(t), {"logprob": _finite(lp), "rank": r, "decoded_token": token_text(t)})
        out.append(position)
    return out


def _prompt_entries(columns: LogprobColumns | None, prompt_ids: list[int]) -> list[LogprobEntry]:
    if columns is None:  # (the engine sent none: the tokens, without logprobs)
        return [(t, None, 0, [], []) for t in prompt_ids]
    return columns.entries()


class Echo:
    """A request's prompts' logprobs as they come, and what echo puts ahead of each choice.

    texts: each prompt's text (as sent, or its token ids decoded), used only with echo; n: the
    samples per prompt (choice c is prompt c // n)."""

    def __init__(self, body, prompts: list[list[int]], texts: list[str] | None, n: int):
        self.echo = bool(getattr(body, "echo", False))
        self.only = self.echo and body.max_tokens == 0  # the prompt alone: nothing generated
        self.logprobs = getattr(body, "logprobs", None) if self.echo else None
        self.prompts, self.texts, self.n = prompts, texts, n
        self.columns: list[LogprobColumns | None] = [None] * len(prompts)
        self._echoed: set[int] = set()
        self._held: dict[int, list[RequestOutput]] = {}

    def ready(self, out: RequestOutput) -> list[RequestOutput]:
        """The outputs that may go to the client now (out, and any held for its prompt's logprobs),
        with the echo applied."""
        p = out.index // self.n
        if out.prompt_logprobs is not None:
            self.columns[p] = out.prompt_logprobs
        if not self.echo:
            return [out]
        if self.logprobs is not None and self.columns[p] is None:
            self._held.setdefault(p, []).append(out)
            return []
        return [self._apply(o) for o in self._held.pop(p, []) + [out]]

    def rest(self) -> list[RequestOutput]:
        """At the end: outputs still held (their prompt's logprobs never came)."""
        held, self._held = self._held, {}
        return [self._apply(o) for outs in held.values() for o in outs]

    def _apply(self, out: RequestOutput) -> RequestOutput:
        if self.only:  # one token ran (the engine needs one); the client gets none of it
            out.new_token_ids, out.new_text, out.num_output_tokens = [], "", 0
            out.logprobs = [] if out.logprobs is not None else None
            if out.finish_reason is not None:
                out.finish_reason, out.matched_stop = FinishReason.LENGTH, ""
        if out.index not in self._echoed:
            self._echoed.add(out.index)
            p = out.index // self.n
            out.new_text = self.texts[p] + out.new_text
            if out.logprobs is not None:
                out.logprobs = _prompt_entries(self.columns[p], self.prompts[p]) + out.logprobs
        return out
