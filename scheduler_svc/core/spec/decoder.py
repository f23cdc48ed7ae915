"""Speculative decoding on the scheduler side (no torch): the n-gram (prompt lookup) proposer,
how many drafts a request may verify in a step, and settling a verify step's result (the
rejected drafts' slots go back, the acceptance counters). See docs/scheduler.md,
"Speculative decoding"; the executor verifies (executor_svc/spec_verify.py). With method
draft_model the executor's draft model proposes (executor_svc/spec_draft.py): the scheduler
decides only how many drafts a row gets (DraftSlots).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields

from step_protocol.domain import DraftSlots, ExecutorInfo

from .logprobs import StepLogprobs, token_output
from .outputs import RequestOutput
from .request import Request
from .spec_rows import VerifyRow, assumed_tail, chainable, settle_row

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpecDecodeConfig:
    """vLLM's --speculative-config fields this server implements (methods ngram, draft_model)."""

    method: str = "ngram"
    num_speculative_tokens: int = 0  # most drafts a request verifies per step
    prompt_lookup_max: int = 0  # longest n-gram matched (tried first); ngram only
    prompt_lookup_min: int = 0  # shortest n-gram matched; ngram only
    model: str = ""  # draft_model: the draft's folder or GGUF (loaded by the executor)
    disable_by_batch_size: int = 0  # nobody speculates with more running requests (0 = never)


def parse_speculative_config(text: str) -> SpecDecodeConfig | None:
    """The --speculative-config JSON (vLLM's meaning); "" = off. ValueError for anything
    else than a valid n-gram or draft-model config. As in vLLM, the method is draft_model
    when "model" is given without one (else ngram), and for ngram a missing lookup bound takes
    the other's value, both missing 5."""
    if not text.strip():
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    known = {f.name for f in fields(SpecDecodeConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unsupported fields {unknown} (supported: {sorted(known)})")
    method = raw.get("method", "draft_model" if "model" in raw else "ngram")
    method = "ngram" if method == "[ngram]" else method
    if method not in METHODS:
        raise ValueError(f"method {method!r}: only 'ngram' (prompt lookup) and 'draft_model' are implemented")
    values = {}
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size"):
        value = raw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        values[name] = value
    k, lo, hi = values["num_speculative_tokens"], values["prompt_lookup_min"], values["prompt_lookup_max"]
    if k is None:
        raise ValueError("num_speculative_tokens is required")
    if method == "draft_model":
        model = raw.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"method draft_model needs \"model\": the draft's folder or GGUF file, got {model!r}")
        if lo is not None or hi is not None:
            raise ValueError("prompt_lookup_min / prompt_lookup_max apply to method ngram only")
        return SpecDecodeConfig("draft_model", k, model=model,
                                disable_by_batch_size=values["disable_by_batch_size"] or 0)
    if "model" in raw:
        raise ValueError("\"model\" applies to method draft_model only")
    lo, hi = (lo or hi or 5), (hi or lo or 5)
    if lo > hi:
        raise ValueError(f"prompt_lookup_min {lo} > prompt_lookup_max {hi}")
    return SpecDecodeConfig("ngram", k, hi, lo, disable_by_batch_size=values["disable_by_batch_size"] or 0)


def check_executor(config: SpecDecodeConfig | None, info: ExecutorInfo) -> None:
    """At the handshake: ValueError when the speculation asked for does not match the
    executor (draft_model needs an executor with a draft model; one that has a draft model
    proposes the drafts itself, so it takes no n-gram drafts)."""
    method = config.method if config is not None else None
    if method == "draft_model" and not info.draft_model_path:
        raise ValueError("--speculative-config method draft_model: the executor has no draft model "
                         "(start it with the same --speculative-config, naming the draft's \"model\")")
    if method == "ngram" and info.draft_model_path:
        raise ValueError(f"--speculative-config method ngram: the executor proposes with its draft model "
                         f"{info.draft_model_path} (use method draft_model, or start it without one)")


class NgramIndex:
    """Prompt lookup, incrementally: for each n in min_n..max_n, a dict from every n-gram of a
    token sequence to the end index of its latest occurrence, updated as the sequence grows
    (it may only be appended to), so a proposal costs O(max_n - min_n + 1) dict lookups plus
    indexing the tokens appended since the last one (C-speed, dict.update over zips), not a
    scan of the whole context. propose() answers exactly what the plain scan would: the up to
    k tokens that followed the latest earlier occurrence of the longest suffix of min_n..max_n
    tokens ([] when none occurs before). Memory: about max_n - min_n + 1 dict entries a token."""

    __slots__ = ("latest", "max_n", "min_n", "num_indexed")

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(min_n, max_n + 1)]
        self.num_indexed = 0  # the n-grams ending before this index are in `latest`

    def _extend(self, between: Callable[[int, int], list[int]], upto: int) -> None:
        """Indexes the n-grams ending at num_indexed..upto-1 (later ones overwrite: latest)."""
        start = self.num_indexed
        seg_start = max(0, start - self.max_n + 1)
        seg = between(seg_start, upto)
        for n, latest in zip(range(self.min_n, self.max_n + 1), self.latest):
            first = max(start, n - 1)  # the first end index of an n-gram to add
            if first < upto:
                part = seg[first - n + 1 - seg_start:]
                latest.update(zip(zip(*[part[i:] for i in range(n)]), range(first, upto)))
        self.num_indexed = upto

    def propose(self, between: Callable[[int, int], list[int]], length: int, k: int) -> list[int]:
        """Drafts for a sequence of `length` tokens, `between(a, b)` being its tokens a..b-1."""
        self._sync(between, length)
        return self._lookup(between, length, k)

    def propose_after(self, between: Callable[[int, int], list[int]], length: int, tail: list[int],
                      k: int) -> list[int]:
        """Drafts for the sequence followed by `tail`, tokens assumed but not known (a chained
        verify row's: the drafts in flight). The tail is not indexed (the index holds known
        tokens only); its suffix is matched against the known tokens, and the continuation may
        run on into the tail."""
        if not tail:
            return self.propose(between, length, k)
        self._sync(between, length)

        def extended(a: int, b: int) -> list[int]:
            head = between(a, min(b, length)) if a < length else []
            return head + tail[max(a - length, 0):max(b - length, 0)]
        return self._lookup(extended, length + len(tail), k)

    def _sync(self, between: Callable[[int, int], list[int]], length: int) -> None:
        upto = length - 1  # an earlier match ends before the suffix's last token
        if upto < self.num_indexed:  # not an extension of the indexed sequence: start over
            self.latest = [{} for _ in self.latest]
            self.num_indexed = 0
        if upto > self.num_indexed:
            self._extend(between, upto)

    def _lookup(self, between: Callable[[int, int], list[int]], length: int, k: int) -> list[int]:
        hi = min(self.max_n, length - 1)
        if hi < self.min_n:
            return []
        suffix = between(length - hi, length)
        for n in range(hi, self.min_n - 1, -1):
            end = self.latest[n - self.min_n].get(tuple(suffix[hi - n:]))
            if end is not None:
                return between(end + 1, min(end + 1 + k, length))
        return []


def propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt lookup on a whole sequence at once (a fresh NgramIndex): the up to k tokens that
    followed the latest earlier occurrence of the longest suffix of `tokens` of min_n..max_n
    tokens; [] when no such suffix occurs before."""
    return NgramIndex(min_n, max_n).propose(lambda a, b: tokens[a:b], len(tokens), k)


@dataclass
class SpecDecodeStats:
    """Running totals (vLLM's spec_decode counters): verify rows, drafts, accepted drafts."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def take(self) -> tuple[int, int, int]:
        out = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        return out


class SpecDecoder:
    """Proposes drafts for decode rows whose tokens are all known, and settles the results."""

    def __init__(self, config: SpecDecodeConfig, max_model_len: int, eos_token_ids: tuple[int, ...]):
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.stats = SpecDecodeStats()

    def eligible(self, request: Request) -> bool:
        """Requests whose sampling the verifier implements: no logits processors (their state
        is per position) and no logprobs (the verifier returns none)."""
        if request.spec_eligible is None:
            p = request.params
            request.spec_eligible = (p.logprobs is None and p.prompt_logprobs is None
                                     and not p.sampler_params(self.eos_token_ids).uses_processors)
        return request.spec_eligible

    def propose(self, request: Request, budget: int) -> list[int]:
        """Drafts for a decode row of `request` (its last token known, none in flight) within
        `budget` more tokens of this step, max_tokens and the context; [] = a plain decode."""
        if request.num_pending_tokens or request.num_computed_tokens != request.num_tokens - 1:
            return []
        k = min(self.config.num_speculative_tokens, budget,
                request.params.max_tokens - request.num_output_tokens - 1,  # 1 + k tokens out
                self.max_model_len - request.num_tokens - 1)
        if k <= 0 or not self.eligible(request):
            return []
        if self.config.method == "draft_model":  # the executor's draft model proposes them
            return DraftSlots(k)
        index = request.ngram_index
        if index is None:
            index = request.ngram_index = NgramIndex(self.config.prompt_lookup_min,
                                                     self.config.prompt_lookup_max)
        return index.propose(request.token_ids_between, request.num_tokens, k)

    def propose_chained(self, request: Request, budget: int) -> list[int]:
        """Drafts of a chained verify row (spec_rows.py) after the request's rows in flight,
        within `budget` tokens of this step (the row takes 1 + drafts): the n-gram continuation
        of its known tokens followed by the tokens its rows assume, past the token the match
        predicts after them (their last row's guess, recorded here); with a draft model
        DraftSlots (the executor's draft proposes them). [] = none: it waits for its results (a
        void row, max_tokens or the context reached, no match)."""
        draft_model = self.config.method == "draft_model"
        assumed = chainable(request) if draft_model or request.ngram_index is not None else 0
        if not assumed:
            return []
        k = min(self.config.num_speculative_tokens, budget - 1,
                request.params.max_tokens - request.num_output_tokens - assumed - 1,
                self.max_model_len - request.num_tokens - assumed - 1)
        if k <= 0:
            return []
        if draft_model:  # the executor's draft proposes them, after the previous row's on the device
            return DraftSlots(k)
        after = request.ngram_index.propose_after(request.token_ids_between, request.num_tokens,
                                                  assumed_tail(request), k + 1)
        if len(after) < 2:
            return []
        request.spec_rows[-1].guess = after[0]
        return after[1:]

    def record(self, request: Request, step_id: int, drafts: list[int], chained: bool) -> None:
        """A verify row of `request` is in the plan of step_id."""
        request.spec_rows.append(VerifyRow(step_id, drafts, chained))

    def settle(self, request: Request, token_ids: int | list[int] | None) -> int:
        """Applies the result of the request's oldest verify row (spec_rows.settle_row): returns
        its slots whose KV is void, counts its drafts."""
        void, num_drafts, accepted = settle_row(request, token_ids)
        if num_drafts:
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += num_drafts
            self.stats.num_accepted_tokens += accepted
        return void


def tokens_output(request: Request, token_ids: int | list[int], eos_token_ids: tuple[int, ...],
                  max_model_len: int, logprobs: StepLogprobs) -> RequestOutput:
    """logprobs.token_output of a step's token, or of a verify step's tokens up to the first
    that finishes the request (none past it is appended or streamed), as one output."""
    if isinstance(token_ids, int):
        return token_output(request, token_ids, eos_token_ids, max_model_len, logprobs)
    outs = []
    for token_id in token_ids:
        outs.append(token_output(request, token_id, eos_token_ids, max_model_len, logprobs))
        if outs[-1].finish_reason is not None:
            break
    return merge_outputs(outs)


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """The outputs of one request's tokens of one step, as one output (in order)."""
    if len(outputs) == 1:
        return outputs[0]
    first, last = outputs[0], outputs[-1]
    logprobs = None if first.logprobs is None else [e for o in outputs for e in o.logprobs]
    return RequestOutput(first.req_id, [t for o in outputs for t in o.new_token_ids],
                         "".join(o.new_text for o in outputs), last.finish_reason, last.matched_stop,
                         first.num_prompt_tokens, last.num_output_tokens, logprobs,
                         first.prompt_logprobs)
