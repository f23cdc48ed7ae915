"""Request bodies of the OpenAI-compatible HTTP API (pydantic), and their conversion to the
API's own RawParams and prompts (validated by request_params.py, as the gRPC door's are).

No field is silently ignored: a body with a field not declared here is refused with 400
naming it (`extra="forbid"`; UNSUPPORTED gives the reason for the fields clients send most).
The only fields accepted and ignored are those that cannot change the output (IGNORED)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler_svc.api.http.constraints import StructuredFields
from scheduler_svc.api.prompts import ChatPrompt, TextPrompt, TokenIdsPrompt
from scheduler_svc.api.request_params import RawParams
from scheduler_svc.api.tools.fields import MessageToolCall, Tool, ToolChoice
from scheduler_svc.api.validation import invalid

# Fields of OpenAI's and vLLM's APIs that change the output and that this server does not
# implement yet: refused by name, with what they are (docs/api.md lists them).
UNSUPPORTED = {
    "guided_decoding_backend": "choosing a structured-outputs backend (llguidance is the one)",
    "structural_tag": "structural tags", "disable_additional_properties": "rewriting JSON schemas",
    "functions": "the deprecated function calling (send tools)",
    "function_call": "the deprecated function calling (send tool_choice)",
    "audio": "audio", "modalities": "audio", "reasoning_effort": "reasoning models",
    "web_search_options": "web search", "prediction": "predicted outputs",
    "skip_special_tokens": "special-token handling", "spaces_between_special_tokens": "special-token handling",
    "use_beam_search": "beam search", "length_penalty": "beam search",
    "bad_words": "bad words", "allowed_token_ids": "allowed token ids",
    "truncate_prompt_tokens": "prompt truncation", "chat_template": "custom chat templates",
    "chat_template_kwargs": "custom chat templates", "continue_final_message": "continuing a message",
    "add_special_tokens": "special-token handling", "documents": "RAG documents",
    "continuous_usage_stats": "usage in every chunk", "name": "named chat participants",
}


COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data):
        """OpenAI's fields are nullable: null means "not set" (also for a refused field)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Body):
    include_usage: bool = False


class _Ignored(_Body):
    """Fields accepted and ignored: none can change the output (OpenAI's bookkeeping, caching
    and routing hints; parallel_tool_calls: a chat with tools reads it, nothing else does)."""

    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    parallel_tool_calls: bool | None = None


IGNORED = tuple(_Ignored.model_fields)


class _Sampling(StructuredFields, _Ignored):
    """Fields both generation endpoints share (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False  # each choice also carries its token ids ("token_ids")
    prompt_logprobs: int | None = None  # each prompt token's logprob and this many alternatives

    def raw_params(self, max_tokens: int | None, logprobs: bool, top_logprobs: int,
                   default_max_tokens: int | None = None, prompt_logprobs: int | None = None) -> RawParams:
        if self.prompt_logprobs is not None and self.stream:  # (as vLLM refuses them)
            raise invalid("prompt_logprobs are not available with stream=true", "prompt_logprobs")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        try:
            bias = {int(k): v for k, v in (self.logit_bias or {}).items()}
        except ValueError:
            raise invalid("logit_bias keys must be token ids (integers as strings)", "logit_bias") from None
        top_k = self.top_k or 0
        return RawParams(
            max_tokens=max_tokens, temperature=self.temperature,
            top_k=0 if top_k == -1 else top_k,  # vLLM's -1 = off, ours 0
            top_p=self.top_p, seed=self.seed, stop=stop, stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos, include_stop_str_in_output=self.include_stop_str_in_output,
            n=self.n, logprobs=logprobs, top_logprobs=top_logprobs, prompt_logprobs=prompt_logprobs,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self.repetition_penalty, min_p=self.min_p or 0.0,
            logit_bias=bias, min_tokens=self.min_tokens, default_max_tokens=default_max_tokens,
            constraint=self.constraint(),
        )

    def client_param(self, param: str | None) -> str | None:
        """A refused field's name as this body spells it (validation names the domain's)."""
        return param

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def to_prompts(self) -> list:
        """One prompt, or each of a list of strings or of token-id lists (fanout.py)."""
        p = self.prompt
        many = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
        return [TextPrompt(x) if isinstance(x, str) else TokenIdsPrompt(x) for x in many]

    def to_raw(self) -> RawParams:
        max_tokens, prompt_logprobs = self.max_tokens, self.prompt_logprobs
        if self.echo and max_tokens == 0:  # the prompt alone (echo.py): one token runs, unsent
            if self.min_tokens:
                raise invalid(f"min_tokens={self.min_tokens} exceeds max_tokens=0", "min_tokens")
            max_tokens = 1
        if self.echo and prompt_logprobs is None:  # echo's logprobs are the prompt's (vLLM's rule)
            prompt_logprobs = self.logprobs
        if self.suffix:
            raise invalid("suffix is not supported (no fill-in-the-middle)", "suffix")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise invalid("best_of must equal n (best_of sampling is not supported)", "best_of")
        if self.logprobs is not None and self.logprobs < 0:
            raise invalid(f"logprobs={self.logprobs} must be >= 0", "logprobs")
        # OpenAI's and vLLM's completions generate 16 tokens when max_tokens is unset
        return self.raw_params(max_tokens, self.logprobs is not None, self.logprobs or 0,
                               COMPLETIONS_DEFAULT_MAX_TOKENS, prompt_logprobs)

    def client_param(self, param: str | None) -> str | None:
        return "logprobs" if param == "top_logprobs" else param


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls (api/tools/)
    tool_call_id: str | None = None  # a tool result's call

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class _Turn:
    """A chat turn as the prompts module reads it (role and content strings)."""

    __slots__ = ("role", "content")

    def __init__(self, role: str, content: str):
        self.role, self.content = role, content


def chat_prompt(messages: list[ChatMessage], add_generation_prompt: bool) -> ChatPrompt:
    """A chat without tool turns (a chat completion's with them: api/tools/plan.py)."""
    if any(m.tool_calls or m.tool_call_id is not None for m in messages):
        raise invalid("tool calls and tool results are rendered for /v1/chat/completions only", "messages")
    return ChatPrompt([_Turn(m.role, m.text) for m in messages], add_generation_prompt)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM's extra
    tools: list[Tool] | None = None  # api/tools/plan.py checks them
    tool_choice: ToolChoice | None = None

    def to_prompt(self) -> ChatPrompt:
        return chat_prompt(self.messages, self.add_generation_prompt)

    def to_raw(self) -> RawParams:
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
        return self.raw_params(max_tokens, self.logprobs, self.top_logprobs or 0,
                               prompt_logprobs=self.prompt_logprobs)

    def client_param(self, param: str | None) -> str | None:
        if param == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return "messages" if param == "prompt" else param


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a text prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    def to_prompt(self):
        if (self.prompt is None) == (self.messages is None):
            raise invalid("send exactly one of prompt and messages")
        if self.messages is not None:
            return chat_prompt(self.messages, self.add_generation_prompt)
        return TextPrompt(self.prompt, add_special_tokens=self.add_special_tokens)


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)
    skip_special_tokens: bool = True
