"""The warm-up's plans (startup/warmup.py runs them): a step of every kind a request can reach
outside the captured graphs, so that serving compiles no Triton kernel.

Triton compiles a variant of a kernel per distinct dtypes, constexprs (tile sizes and launch
configs picked from host ints), integer arguments equal to 1 or divisible by 16, and 16-byte
pointer alignment (kernels/jit_cache.py). The graphs captured at start compile what they
replay; the rest is compiled by the first step that runs it. Per class of that (why each):
  - eager forwards, steps of more tokens than the largest mixed graph (all with --enforce-eager):
    token counts T and request counts B by `token_class` / `request_class` (1, a multiple of 16
    or not, the power-of-two buckets of the tuned skinny / FP8 GEMMs' rows, the varlen kernel's
    search depth), and the largest step (the allocator's and cuBLAS's largest shapes);
  - eager decode batches (past the largest decode graph, or no graphs) by the decode attention's
    launch variant (kernels/attention_decode.py `decode_variant`: tile, splits, warps, stages);
  - the sampler, whose input is the model dtype after a graph and float32 after an eager forward
    or the logits processors: plain (greedy, temperature), top-k/top-p (sort path), processors
    and logprobs, structured-output masks (the kernel's mask variant), each after a mixed graph,
    a decode graph and an eager forward; prompt logprobs, a chunked prefill;
  - verify rows, with an odd and an even number of drafts, chained or not (kernels/spec_verify.py's
    two variants); with a draft model, its eager
    decodes over the verify rows per batch-size class of its decode variants.
A scenario is a list of plans run from an empty runner; its requests share one KV block range
(their KV is never read back; overwritten later as any free block is). Pure: tested on CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from step_protocol.domain import CachedRequestData, DraftSlots, NewRequestData, SamplerParams, StepPlan

# the tuned GEMMs key on power-of-two row buckets: skinny to 16, w8a16 to 64, w8a8 to 512
# (kernels/fp8_w8a8.py W8A8_TUNE_MAX_M; beyond, one untuned choice): buckets stop at 1024
ROW_BUCKET_CAP = 1024
MARGIN = 8  # tokens a warm-up request may compute past its prompt (decodes, drafts)


def token_class(x: int) -> tuple:
    """What a kernel variant can depend on in a count of rows x (tokens, sampled rows): Triton's
    integer specialization (1, a multiple of 16) and the row buckets of the tuned GEMMs."""
    return (x == 1, x % 16 == 0, min(1 << (x - 1).bit_length(), ROW_BUCKET_CAP))


def request_class(x: int) -> tuple:
    """token_class, and the varlen attention's search depth over x requests (9 halvings up to 511)."""
    return (*token_class(x), max(x.bit_length(), 9))


def representatives(lo: int, hi: int, key: Callable[[int], Hashable] = token_class) -> list[int]:
    """The smallest x of each key(x) in lo..hi, and hi itself; ascending (empty if hi < lo)."""
    seen, out = set(), []
    for x in range(lo, hi + 1):
        if (k := key(x)) not in seen:
            seen.add(k)
            out.append(x)
    return out + [hi] if out and out[-1] != hi else out


def runs_eager(num_tokens: int, num_reqs: int, decode_sizes: tuple[int, ...], mixed_sizes: tuple[int, ...]) -> bool:
    """GraphRunner.shape_for's rule (a step needing no hidden states): no captured graph holds it."""
    if num_tokens == num_reqs and decode_sizes and num_reqs <= decode_sizes[-1]:
        return False
    return not mixed_sizes or num_tokens > mixed_sizes[-1]


@dataclass(frozen=True)
class WarmupShapes:
    """What the warm-up's plans are made for (warmup.shapes_of(runner) on the executor)."""

    max_num_seqs: int
    max_num_tokens: int  # max_num_batched_tokens
    max_tokens_per_req: int  # the longest prompt a warm-up request may have (KV blocks, max_model_len)
    block_size: int
    vocab_size: int
    max_logprobs: int
    decode_sizes: tuple[int, ...] = ()  # captured decode graphs, ascending (none: eager)
    mixed_sizes: tuple[int, ...] = ()  # captured mixed graphs, ascending
    draft_model: bool = False  # verify rows carry draft counts (the executor's draft model proposes)
    grammar: str = ""  # a grammar for the structured-output classes ("" = none: no tokenizer.json)
    decode_key: Callable[[int], Hashable] | None = None  # batch size -> decode kernels' variant

    def eager_tokens(self) -> int:
        """The fewest tokens of a step (of fewer requests than tokens) that runs eagerly."""
        return self.mixed_sizes[-1] + 1 if self.mixed_sizes else 2


greedy = SamplerParams  # temperature 0 unless given


def sampling_classes(shapes: WarmupShapes) -> dict[str, list[SamplerParams]]:
    """The requests of each sampling path (a step takes the path of its rows together)."""
    lp = min(1, shapes.max_logprobs) or -1
    hot = dict(temperature=0.8, seed=7)
    processors = dict(repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1, min_p=0.05,
                      logit_bias=((0, 1.0),), min_tokens=2, min_tokens_stop_ids=(0,))
    classes = {
        "plain": [greedy(), SamplerParams(**hot)],
        "top-k/top-p": [greedy(), SamplerParams(top_k=5, top_p=0.9, **hot)],
        "processors": [greedy(logprobs=lp), SamplerParams(logprobs=lp, **processors, **hot)],
        "logprobs": [greedy(logprobs=lp), SamplerParams(logprobs=lp, **hot)],
    }
    if shapes.grammar:
        g = shapes.grammar
        classes["grammar"] = [greedy(), SamplerParams(grammar=g, **hot)]
        classes["grammar, top-k"] = [SamplerParams(grammar=g, top_k=5, **hot)]
        classes["grammar, processors"] = [SamplerParams(grammar=g, **processors, **hot)]
    return classes


class WarmupPlans:
    """Makes the warm-up's scenarios: lists of plans, each list run from an empty runner."""

    def __init__(self, shapes: WarmupShapes):
        self.shapes = shapes
        self.req_id = self.step_id = 0

    def scenarios(self) -> list[list[StepPlan]]:
        s = self.shapes
        if s.max_tokens_per_req < 2:
            return []
        every = [*self.size_scenarios(), *self.decode_scenarios(), *self.sampling_scenarios(),
                 self.prompt_scenario(), *self.verify_scenarios()]
        return [kept for plans in every if (kept := self.within_max_num_seqs(plans))]

    def within_max_num_seqs(self, plans: list[StepPlan]) -> list[StepPlan]:
        """The scenario's plans up to the first that would hold more than max_num_seqs requests
        (no warm-up request finishes: each plan's new requests add up)."""
        running: set[int] = set()
        for i, plan in enumerate(plans):
            running.update(n.req_id for n in plan.new_requests)
            if len(running) > self.shapes.max_num_seqs:
                return plans[:i]
        return plans

    # ---- eager forwards -------------------------------------------------------------------
    def size_scenarios(self) -> list[list[StepPlan]]:
        """A step of new requests per eager (T, B) class: each T with the fewest requests that
        hold it, each B at the fewest eager tokens it can hold."""
        s, lo = self.shapes, self.shapes.eager_tokens()
        pairs = [(t, self.fewest_reqs(t)) for t in representatives(lo, s.max_num_tokens)]
        for b in representatives(1, s.max_num_seqs, request_class):
            t = max(lo, b + 1)
            if t <= min(s.max_num_tokens, b * s.max_tokens_per_req):
                pairs.append((t, b))
        pairs = sorted({(t, b) for t, b in pairs if b <= s.max_num_seqs})
        return [[self.plan(self.news(split(t, b), [greedy(), SamplerParams(temperature=0.8, seed=7)]))]
                for t, b in pairs]

    def decode_scenarios(self) -> list[list[StepPlan]]:
        """An eager decode step per batch-size class (1-token prompts, then one decode step). A
        draft model's one-token catch-ups have its decode graphs only (no mixed ones)."""
        s = self.shapes
        mixed = () if s.draft_model else s.mixed_sizes
        sizes = [b for b in range(1, s.max_num_seqs + 1) if runs_eager(b, b, s.decode_sizes, mixed)]
        if not sizes:
            return []
        key = s.decode_key or (lambda b: None)
        out = []
        for b in representatives(sizes[0], sizes[-1], lambda b: (request_class(b), key(b))):
            news = self.news([1] * b, [greedy(), SamplerParams(temperature=0.8, seed=7)])
            out.append([self.plan(news), self.plan(cached=decode_rows(news))])
        return out

    # ---- the sampler's paths ----------------------------------------------------------------
    def sampling_scenarios(self) -> list[list[StepPlan]]:
        """Per sampling class: short prompts (a mixed graph), a decode step (a decode graph and
        the sampler's graphs) and, without a grammar, a second one (a steady step: worker/steady.py,
        its advance on the device), then new prompts of the class beside those decodes, eager.
        A class of more rows than max_num_seqs runs as several scenarios."""
        s, lo = self.shapes, self.shapes.eager_tokens()
        out = []
        groups = [params[i:i + s.max_num_seqs] for params in sampling_classes(s).values()  # (--max-num-seqs 1)
                  for i in range(0, len(params), s.max_num_seqs)]
        for params in groups:
            first = self.news([3 + i for i in range(len(params))], params)
            plans = [self.plan(first), self.plan(cached=decode_rows(first))]
            if not any(p.grammar for p in params):  # (a grammar row's tokens must not complete it)
                plans.append(self.plan(cached=decode_rows(first)))  # steady: worker/steady.py
            new_tokens = lo - len(first)
            b = self.fewest_reqs(new_tokens)
            if s.mixed_sizes and lo <= s.max_num_tokens and len(first) + b <= s.max_num_seqs:
                plans.append(self.plan(self.news(split(new_tokens, b), params), decode_rows(first)))
            out.append(plans)
        return out

    def prompt_scenario(self) -> list[StepPlan]:
        """Prompt logprobs (a mixed graph, then an eager step) and a chunked prefill: a first
        chunk that samples nothing, then the rest."""
        s = self.shapes
        lp = SamplerParams(prompt_logprobs=min(1, s.max_logprobs) or -1)
        plans = [self.plan(self.news([5], [lp]))]
        lo = s.eager_tokens()
        if lo <= s.max_num_tokens:
            plans.append(self.plan(self.news(split(lo, self.fewest_reqs(lo)), [lp])))
        half = max(1, min(s.max_tokens_per_req, s.max_num_tokens) // 2)
        chunked = self.new(2 * half, lp, scheduled=half)
        plans += [self.plan([chunked]), self.plan(cached=CachedRequestData([chunked.req_id], [half], [0], []))]
        return plans

    def verify_scenarios(self) -> list[list[StepPlan]]:
        """Speculative verify rows (their token rows and their tails, spec_decode/verify_tail.py:
        the random tail's rejection rule), with an odd and an even number of drafts; with every
        row greedy (the greedy tail); with a top-k row (no tail: the general rejection rule and
        the verify scan). With a draft model, its eager decodes over the verify rows: one
        scenario per batch-size class of its decode variants."""
        drafts = [(2, 1), (1, 1)]
        if self.shapes.draft_model:
            key = self.shapes.decode_key or (lambda b: None)
            drafts += [(2,) * b for b in representatives(1, self.shapes.max_num_seqs,
                                                         lambda b: (request_class(b), key(b)))]
        scenarios = [self.verify_rows(d) for d in drafts if len(d) <= self.shapes.max_num_seqs]
        cut = SamplerParams(temperature=0.8, top_k=5, seed=7)
        return scenarios + [self.verify_rows((2,), [greedy()]), self.verify_rows((2, 1), [greedy(), cut])]

    def verify_rows(self, drafts: tuple[int, ...], params: list[SamplerParams] | None = None) -> list[StepPlan]:
        """New 4-token prompts (a greedy and a random one in turn, or `params`'), then a verify row
        of each with drafts[i] drafts, then chained verify rows (the verify scan's other variant)."""
        news = self.news([4] * len(drafts), params or [greedy(), SamplerParams(temperature=0.8, seed=7)])
        plans = [self.plan(news)]
        for chained in (False, True):
            plan = self.plan(cached=CachedRequestData())
            for new, d in zip(news, drafts):
                plan.cached_requests.append(new.req_id, 1 + d, [])
                plan.add_drafts(DraftSlots(d) if self.shapes.draft_model else [1] * d, chained=chained)
            plans.append(plan)
        return plans

    # ---- plans and requests -------------------------------------------------------------------
    def fewest_reqs(self, num_tokens: int) -> int:
        return -(-num_tokens // self.shapes.max_tokens_per_req)

    def plan(self, news: list[NewRequestData] = (), cached: CachedRequestData | None = None) -> StepPlan:
        self.step_id += 1
        return StepPlan(self.step_id, list(news), cached if cached is not None else CachedRequestData())

    def news(self, lengths: list[int], params: list[SamplerParams]) -> list[NewRequestData]:
        """New requests of these prompt lengths, their parameters taken in turn from params."""
        return [self.new(n, params[i % len(params)]) for i, n in enumerate(lengths)]

    def new(self, length: int, params: SamplerParams, scheduled: int | None = None) -> NewRequestData:
        """A request of `length` tokens (ids 1, 2, ... within the vocabulary) over blocks 1.. (every
        warm-up request shares them: their KV is never read back)."""
        s = self.shapes
        self.req_id += 1
        tokens = [1 + i % (s.vocab_size - 1) for i in range(length)]
        blocks = list(range(1, 1 + -(-(length + MARGIN) // s.block_size)))
        return NewRequestData(self.req_id, tokens, params, blocks, 0, scheduled or length, num_prompt_tokens=length)


def decode_rows(news: list[NewRequestData]) -> CachedRequestData:
    return CachedRequestData.decode_rows([n.req_id for n in news])


def split(total: int, parts: int) -> list[int]:
    """total tokens as `parts` prompt lengths differing by at most one."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
