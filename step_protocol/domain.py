"""Domain types of the step protocol, shared by the scheduler (which writes plans and reads
results) and the executor (which reads plans and writes results). See docs/contracts.md.

A request's data crosses once (NewRequestData), then only deltas (CachedRequestData, held as
columns end to end, as vLLM V1's scheduler output does). Decode rows carry no token ids: past
the tokens it was sent, a request's input is the token the executor sampled for it last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmserve.limits import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_MIN_TOKENS_STOP_IDS


@dataclass(frozen=True)
class SamplerParams:
    """How the executor's sampler picks a request's tokens (the device part of a request's
    parameters; stop rules and max_tokens stay in the scheduler)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    seed: int = 0  # sampling is a pure function of (seed, position)
    # Logits processors (vLLM's meanings), applied in this order before temperature:
    # logit_bias and the min_tokens mask, then the penalties, then (after temperature) min_p.
    min_p: float = 0.0  # 0 = off; drop tokens with prob < min_p * (top token's prob)
    presence_penalty: float = 0.0  # subtracted once from each token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0  # 1 = off; divides positive / multiplies negative logits
    #   of tokens in the prompt or the output (CTRL-style)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # until this many tokens are generated, min_tokens_stop_ids are masked
    min_tokens_stop_ids: tuple[int, ...] = ()  # the EOS ids (unless ignore_eos) + stop_token_ids
    # Logprobs of each sampled token (-1 = none, 0 = the sampled token's only, k = plus the
    # top-k alternatives) and of each prompt token after the first (-1 = none).
    logprobs: int = -1
    prompt_logprobs: int = -1
    # Structured outputs: the grammar every sampled token must follow, as llguidance's grammar
    # text (llmserve.structured.to_grammar of the request's constraint); "" = unconstrained.
    grammar: str = ""

    @property
    def uses_processors(self) -> bool:
        """Whether any logits processor changes this request's logits."""
        return bool(self.min_p > 0 or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0 or self.logit_bias
                    or (self.min_tokens > 0 and self.min_tokens_stop_ids))

    @property
    def uses_penalties(self) -> bool:
        """Whether the request needs its generated-token counts on the device."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


@dataclass
class NewRequestData:
    """A request the executor has no row for: sent in full, once (again after preemption)."""

    req_id: int
    # Every token id known so far: the prompt, plus the tokens generated before a preemption.
    token_ids: list[int]
    sampler_params: SamplerParams
    # The whole block table; later steps send only appended blocks.
    block_ids: list[int]
    # Tokens whose KV is already in the cache: the leading block_ids hold them (a prefix-cache
    # hit, whole blocks, possibly shared with other rows; never written by this row). 0 = none.
    num_computed_tokens: int
    # Tokens to compute this step, starting at num_computed_tokens (a chunk may stop short).
    num_scheduled_tokens: int
    # How many of token_ids are the prompt (the rest were generated before a preemption):
    # penalties count generated tokens, min_tokens counts from here. 0 = all of them.
    num_prompt_tokens: int = 0

    @property
    def prompt_len(self) -> int:
        return self.num_prompt_tokens or len(self.token_ids)


@dataclass
class CachedRequestData:
    """Requests the executor already holds a row for, scheduled again: parallel columns,
    one entry per row in plan order (only what changed)."""

    req_ids: list[int] = field(default_factory=list)
    # Tokens each row computes this step; a decode row is 1 and carries no token id because
    # the executor feeds its own last sample.
    num_scheduled_tokens: list[int] = field(default_factory=list)
    # Blocks appended to each row's table this step (usually 0) ...
    num_new_blocks: list[int] = field(default_factory=list)
    # ... and those blocks, concatenated in row order.
    new_block_ids: list[int] = field(default_factory=list)

    @classmethod
    def decode_rows(cls, req_ids: list[int]) -> CachedRequestData:
        """Plain decode rows: one token each, no new block."""
        n = len(req_ids)
        return cls(list(req_ids), [1] * n, [0] * n, [])

    def append(self, req_id: int, num_scheduled_tokens: int, new_block_ids: list[int]) -> None:
        self.req_ids.append(req_id)
        self.num_scheduled_tokens.append(num_scheduled_tokens)
        self.num_new_blocks.append(len(new_block_ids))
        self.new_block_ids.extend(new_block_ids)

    def __len__(self) -> int:
        return len(self.req_ids)


class DraftSlots(list):
    """d drafts that the executor's draft model proposes (speculative decoding, method
    draft_model): the scheduler knows only how many, so the list holds d placeholders (0) and
    a plan carries its length alone (num_draft_tokens, no draft_token_ids)."""

    def __init__(self, count: int):
        super().__init__([0] * count)


@dataclass
class StepPlan:
    """The plan of one step, as the scheduler decided it and the executor runs it."""

    step_id: int
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: CachedRequestData = field(default_factory=CachedRequestData)
    # Requests that finished or were aborted since the last plan: the executor drops their rows.
    finished_req_ids: list[int] = field(default_factory=list)
    # Requests preempted since the last plan: the executor drops their rows; they come back
    # later as NewRequestData.
    preempted_req_ids: list[int] = field(default_factory=list)
    # Speculative decoding: the drafts of cached row i (num_scheduled_tokens = 1 + drafts);
    # rows past the end of num_draft_tokens have none (empty = a step without drafts).
    num_draft_tokens: list[int] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)
    # Chained verify rows (planned while the request's previous verify row is in flight,
    # assuming it accepts every draft; void on the executor when it did not): True at the
    # cached row's index; rows past the end of the list are not chained.
    draft_chained: list[bool] = field(default_factory=list)

    def add_drafts(self, draft_token_ids: list[int], chained: bool = False) -> None:
        """Gives the cached row appended last these drafts (DraftSlots: their count only, the
        executor's draft model proposes them); chained: a chained verify row."""
        self.num_draft_tokens += [0] * (len(self.cached_requests) - 1 - len(self.num_draft_tokens))
        self.num_draft_tokens.append(len(draft_token_ids))
        if not isinstance(draft_token_ids, DraftSlots):
            self.draft_token_ids.extend(draft_token_ids)
        if chained:
            self.draft_chained += [False] * (len(self.cached_requests) - 1 - len(self.draft_chained))
            self.draft_chained.append(True)

    @property
    def num_scheduled_tokens(self) -> int:
        return (sum(r.num_scheduled_tokens for r in self.new_requests)
                + sum(self.cached_requests.num_scheduled_tokens))

    @property
    def scheduled_req_ids(self) -> list[int]:
        """Rows of this step, in plan order (new requests first)."""
        return [r.req_id for r in self.new_requests] + self.cached_requests.req_ids

    def has_rows(self) -> bool:
        """Whether the step computes anything (a plan without rows needs no result)."""
        return bool(self.new_requests or self.cached_requests.req_ids)

    def is_empty(self) -> bool:
        """Nothing to tell the executor at all (no rows, nothing to forget)."""
        return not (self.has_rows() or self.finished_req_ids or self.preempted_req_ids)


@dataclass
class Logprobs:
    """Log-probabilities of M positions, as columns: for position i the logprob and rank
    (1 = the most likely token) of `token_ids[i]`, and the top `num_top` alternatives, flat
    (top_token_ids[i * num_top:(i + 1) * num_top], most likely first)."""

    num_top: int = 0
    token_ids: list[int] = field(default_factory=list)  # [M]
    logprobs: list[float] = field(default_factory=list)  # [M]
    ranks: list[int] = field(default_factory=list)  # [M]
    top_token_ids: list[int] = field(default_factory=list)  # [M * num_top]
    top_logprobs: list[float] = field(default_factory=list)  # [M * num_top]

    def __len__(self) -> int:
        return len(self.token_ids)

    def row(self, i: int) -> tuple[int, float, int, list[int], list[float]]:
        """(token id, logprob, rank, top ids, top logprobs) of position i."""
        k = self.num_top
        return (self.token_ids[i], self.logprobs[i], self.ranks[i],
                self.top_token_ids[i * k:(i + 1) * k], self.top_logprobs[i * k:(i + 1) * k])


@dataclass
class PromptLogprobs:
    """Prompt logprobs computed by one step: request i of req_ids gets counts[i] consecutive
    prompt positions starting at first_positions[i] (>= 1: the first prompt token has none),
    their rows concatenated in `values`."""

    req_ids: list[int] = field(default_factory=list)
    first_positions: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    values: Logprobs = field(default_factory=Logprobs)


@dataclass
class StepResult:
    """What the executor answers for one plan: a sampled token per request that completed its
    known tokens (a partial prefill chunk samples nothing), in plan order, and timings."""

    step_id: int
    req_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prepare_us: int = 0  # host-side input preparation
    forward_us: int = 0  # device time of the forward pass
    sample_us: int = 0  # device time of sampling
    graph_size: int = 0  # batch size of the replayed CUDA graph; 0 = eager
    queued_us: int = 0  # the plan waiting on the executor between its arrival and its launch
    launch_us: int = 0  # the launch on the device thread (host time)
    launch_cpu_us: int = 0  # its thread CPU time (launch_us minus this: waiting for the GIL)
    device_idle_us: int = 0  # device idle before this step started (CUDA; 0 = queued in time)
    # Logprobs of the sampled tokens, one row per entry of req_ids; None when no request of
    # the step asked (rows of requests that did not ask are there but meaningless).
    logprobs: Logprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None
    # Non-empty when the whole plan was refused (nothing applied) or the step failed: the
    # scheduler fails every request of the step.
    error: str = ""
    # Speculative decoding: how many of token_ids each req_ids entry has (accepted drafts,
    # then one sampled token); empty = one each.
    num_tokens: list[int] = field(default_factory=list)
    # Rows that failed alone (refused or not prepared; nothing of them applied, a cached one
    # forgotten) while the rest of the plan ran, and why, one line each: the scheduler fails
    # exactly these requests (plan_rows.py, docs/contracts.md).
    failed_req_ids: list[int] = field(default_factory=list)
    failed_errors: list[str] = field(default_factory=list)

    def sampled(self) -> dict[int, int] | dict[int, list[int]]:
        """req_id -> sampled token id; with num_tokens, req_id -> its list of token ids."""
        if not self.num_tokens:
            return dict(zip(self.req_ids, self.token_ids))
        out, i = {}, 0
        for req_id, n in zip(self.req_ids, self.num_tokens):
            out[req_id] = self.token_ids[i:i + n]
            i += n
        return out


@dataclass(frozen=True)
class ExecutorInfo:
    """What the executor loaded and allocated (the handshake answer)."""

    model_name: str
    model_path: str  # folder the model was loaded from (the scheduler reads its tokenizer)
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    block_size: int
    num_blocks: int  # null block 0 included
    cuda_graph_sizes: tuple[int, ...]  # captured, ascending; () when eager
    max_num_seqs: int
    max_num_batched_tokens: int
    device: str
    dtype: str
    max_logprobs: int = MAX_LOGPROBS  # most top alternatives per position (logprobs, prompt_logprobs)
    max_logit_bias: int = MAX_LOGIT_BIAS  # most logit_bias entries per request
    max_min_tokens_stop_ids: int = MAX_MIN_TOKENS_STOP_IDS  # most ids min_tokens may mask per request
    # speculative decoding's draft model (executor_svc/spec_decode/draft.py): its folder; "" = none
    draft_model_path: str = ""
