from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandshakeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecutorInfo(_message.Message):
    __slots__ = ("model_name", "vocab_size", "eos_token_ids", "max_model_len", "block_size", "num_blocks", "cuda_graph_sizes", "max_num_seqs", "max_num_batched_tokens", "device", "dtype", "model_path", "max_logprobs", "max_logit_bias", "max_min_tokens_stop_ids", "draft_model_path")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CUDA_GRAPH_SIZES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MAX_MIN_TOKENS_STOP_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_model_len: int
    block_size: int
    num_blocks: int
    cuda_graph_sizes: _containers.RepeatedScalarFieldContainer[int]
    max_num_seqs: int
    max_num_batched_tokens: int
    device: str
    dtype: str
    model_path: str
    max_logprobs: int
    max_logit_bias: int
    max_min_tokens_stop_ids: int
    draft_model_path: str
    def __init__(self, model_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., cuda_graph_sizes: _Optional[_Iterable[int]] = ..., max_num_seqs: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., model_path: _Optional[str] = ..., max_logprobs: _Optional[int] = ..., max_logit_bias: _Optional[int] = ..., max_min_tokens_stop_ids: _Optional[int] = ..., draft_model_path: _Optional[str] = ...) -> None: ...

class SamplerParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias_token_ids", "logit_bias_values", "min_tokens", "min_tokens_stop_ids", "logprobs", "prompt_logprobs", "grammar")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_VALUES_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_STOP_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias_values: _containers.RepeatedScalarFieldContainer[float]
    min_tokens: int
    min_tokens_stop_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: int
    prompt_logprobs: int
    grammar: str
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias_token_ids: _Optional[_Iterable[int]] = ..., logit_bias_values: _Optional[_Iterable[float]] = ..., min_tokens: _Optional[int] = ..., min_tokens_stop_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., grammar: _Optional[str] = ...) -> None: ...

class NewRequest(_message.Message):
    __slots__ = ("req_id", "token_ids", "sampler_params", "block_ids", "num_computed_tokens", "num_scheduled_tokens", "num_prompt_tokens")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    req_id: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampler_params: SamplerParams
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    num_scheduled_tokens: int
    num_prompt_tokens: int
    def __init__(self, req_id: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampler_params: _Optional[_Union[SamplerParams, _Mapping]] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., num_scheduled_tokens: _Optional[int] = ..., num_prompt_tokens: _Optional[int] = ...) -> None: ...

class CachedRequests(_message.Message):
    __slots__ = ("req_ids", "num_scheduled_tokens", "num_new_blocks", "new_block_ids")
    REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    req_ids: _containers.RepeatedScalarFieldContainer[int]
    num_scheduled_tokens: _containers.RepeatedScalarFieldContainer[int]
    num_new_blocks: _containers.RepeatedScalarFieldContainer[int]
    new_block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, req_ids: _Optional[_Iterable[int]] = ..., num_scheduled_tokens: _Optional[_Iterable[int]] = ..., num_new_blocks: _Optional[_Iterable[int]] = ..., new_block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepPlan(_message.Message):
    __slots__ = ("step_id", "new_requests", "cached_requests", "finished_req_ids", "preempted_req_ids", "num_draft_tokens", "draft_token_ids", "draft_chained")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_CHAINED_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    cached_requests: CachedRequests
    finished_req_ids: _containers.RepeatedScalarFieldContainer[int]
    preempted_req_ids: _containers.RepeatedScalarFieldContainer[int]
    num_draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_chained: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, step_id: _Optional[int] = ..., new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., cached_requests: _Optional[_Union[CachedRequests, _Mapping]] = ..., finished_req_ids: _Optional[_Iterable[int]] = ..., preempted_req_ids: _Optional[_Iterable[int]] = ..., num_draft_tokens: _Optional[_Iterable[int]] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., draft_chained: _Optional[_Iterable[bool]] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("num_top", "token_ids", "logprobs", "ranks", "top_token_ids", "top_logprobs")
    NUM_TOP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    num_top: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, num_top: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., ranks: _Optional[_Iterable[int]] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class PromptLogprobs(_message.Message):
    __slots__ = ("req_ids", "first_positions", "counts", "values")
    REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    req_ids: _containers.RepeatedScalarFieldContainer[int]
    first_positions: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    values: Logprobs
    def __init__(self, req_ids: _Optional[_Iterable[int]] = ..., first_positions: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., values: _Optional[_Union[Logprobs, _Mapping]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "req_ids", "token_ids", "prepare_us", "forward_us", "sample_us", "graph_size", "error", "logprobs", "prompt_logprobs", "queued_us", "launch_us", "device_idle_us", "num_tokens", "failed_req_ids", "failed_errors", "launch_cpu_us")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PREPARE_US_FIELD_NUMBER: _ClassVar[int]
    FORWARD_US_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_US_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_US_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDLE_US_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    FAILED_ERRORS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_CPU_US_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    req_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    prepare_us: int
    forward_us: int
    sample_us: int
    graph_size: int
    error: str
    logprobs: Logprobs
    prompt_logprobs: PromptLogprobs
    queued_us: int
    launch_us: int
    device_idle_us: int
    num_tokens: _containers.RepeatedScalarFieldContainer[int]
    failed_req_ids: _containers.RepeatedScalarFieldContainer[int]
    failed_errors: _containers.RepeatedScalarFieldContainer[str]
    launch_cpu_us: int
    def __init__(self, step_id: _Optional[int] = ..., req_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., prepare_us: _Optional[int] = ..., forward_us: _Optional[int] = ..., sample_us: _Optional[int] = ..., graph_size: _Optional[int] = ..., error: _Optional[str] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Union[PromptLogprobs, _Mapping]] = ..., queued_us: _Optional[int] = ..., launch_us: _Optional[int] = ..., device_idle_us: _Optional[int] = ..., num_tokens: _Optional[_Iterable[int]] = ..., failed_req_ids: _Optional[_Iterable[int]] = ..., failed_errors: _Optional[_Iterable[str]] = ..., launch_cpu_us: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
