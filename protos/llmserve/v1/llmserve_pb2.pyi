from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JsonWhitespace(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JSON_WHITESPACE_UNSPECIFIED: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_FLEXIBLE: _ClassVar[JsonWhitespace]
    JSON_WHITESPACE_COMPACT: _ClassVar[JsonWhitespace]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
JSON_WHITESPACE_UNSPECIFIED: JsonWhitespace
JSON_WHITESPACE_FLEXIBLE: JsonWhitespace
JSON_WHITESPACE_COMPACT: JsonWhitespace
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_CANCELLED: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages", "add_generation_prompt")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "n", "logprobs", "top_logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "logit_bias", "min_tokens", "json_schema", "json_object", "regex", "choice", "grammar", "json_whitespace", "json_whitespace_pattern", "json_lenient")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    JSON_WHITESPACE_PATTERN_FIELD_NUMBER: _ClassVar[int]
    JSON_LENIENT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    include_stop_str_in_output: bool
    n: int
    logprobs: bool
    top_logprobs: int
    prompt_logprobs: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    logit_bias: _containers.ScalarMap[int, float]
    min_tokens: int
    json_schema: str
    json_object: bool
    regex: str
    choice: Choices
    grammar: str
    json_whitespace: JsonWhitespace
    json_whitespace_pattern: str
    json_lenient: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., include_stop_str_in_output: _Optional[bool] = ..., n: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_tokens: _Optional[int] = ..., json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., json_whitespace: _Optional[_Union[JsonWhitespace, str]] = ..., json_whitespace_pattern: _Optional[str] = ..., json_lenient: _Optional[bool] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("text", "token_ids", "chat", "params", "request_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    chat: ChatMessages
    params: SamplingParams
    request_id: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "rank", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    rank: int
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., rank: _Optional[int] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "finish_reason", "usage", "matched_stop", "index", "logprobs", "prompt_logprobs", "total_usage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_USAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: FinishReason
    usage: Usage
    matched_stop: str
    index: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    total_usage: Usage
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., matched_stop: _Optional[str] = ..., index: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., total_usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("request_id", "choices", "usage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    choices: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    usage: Usage
    def __init__(self, request_id: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "chat", "add_special_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    chat: ChatMessages
    add_special_tokens: bool
    def __init__(self, text: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("token_ids", "skip_special_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_special_tokens: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model_name", "max_model_len", "vocab_size", "eos_token_ids", "block_size", "max_logprobs", "max_logit_bias", "max_n")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MAX_N_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    max_logprobs: int
    max_logit_bias: int
    max_n: int
    def __init__(self, model_name: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., max_logprobs: _Optional[int] = ..., max_logit_bias: _Optional[int] = ..., max_n: _Optional[int] = ...) -> None: ...

class GetServerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerStatusResponse(_message.Message):
    __slots__ = ("total_blocks", "free_blocks", "used_blocks", "num_running", "num_waiting", "num_steps", "executor_busy_us", "num_graph_steps", "executor_available", "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate", "step_timings")
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_BUSY_US_FIELD_NUMBER: _ClassVar[int]
    NUM_GRAPH_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    total_blocks: int
    free_blocks: int
    used_blocks: int
    num_running: int
    num_waiting: int
    num_steps: int
    executor_busy_us: int
    num_graph_steps: int
    executor_available: bool
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float
    step_timings: StepTimings
    def __init__(self, total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., used_blocks: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_steps: _Optional[int] = ..., executor_busy_us: _Optional[int] = ..., num_graph_steps: _Optional[int] = ..., executor_available: _Optional[bool] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., prefix_cache_hit_rate: _Optional[float] = ..., step_timings: _Optional[_Union[StepTimings, _Mapping]] = ...) -> None: ...

class StepTimings(_message.Message):
    __slots__ = ("schedule_us", "apply_us", "result_wait_us", "executor_queued_us", "executor_launch_us", "device_idle_us", "apply_deferred_us", "executor_launch_cpu_us")
    SCHEDULE_US_FIELD_NUMBER: _ClassVar[int]
    APPLY_US_FIELD_NUMBER: _ClassVar[int]
    RESULT_WAIT_US_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_QUEUED_US_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_LAUNCH_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDLE_US_FIELD_NUMBER: _ClassVar[int]
    APPLY_DEFERRED_US_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_LAUNCH_CPU_US_FIELD_NUMBER: _ClassVar[int]
    schedule_us: int
    apply_us: int
    result_wait_us: int
    executor_queued_us: int
    executor_launch_us: int
    device_idle_us: int
    apply_deferred_us: int
    executor_launch_cpu_us: int
    def __init__(self, schedule_us: _Optional[int] = ..., apply_us: _Optional[int] = ..., result_wait_us: _Optional[int] = ..., executor_queued_us: _Optional[int] = ..., executor_launch_us: _Optional[int] = ..., device_idle_us: _Optional[int] = ..., apply_deferred_us: _Optional[int] = ..., executor_launch_cpu_us: _Optional[int] = ...) -> None: ...
