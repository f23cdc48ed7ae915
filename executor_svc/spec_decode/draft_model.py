"""Loading speculative decoding's draft model (--speculative-config method draft_model), with
the start-up refusals: a draft must share the target's vocabulary and tokenizer, reach the
served max_model_len, and run on one device (no tensor parallelism yet).

The draft is loaded like the target (model_source: a folder, or a GGUF converted once; the
loader, --dtype and --quantization alike) and gets a KV cache of its own with the target's
block count and block size, so it reuses the target's block tables and slot mapping
(draft.py). KV memory: the blocks are sized for both (kv_block_bytes).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader import checks as model_checks, safetensors as loader, source as model_source
from executor_svc.model_loader.checks import ModelError
from executor_svc.models.llama import LlamaForCausalLM
from executor_svc.startup import kv_cache

log = logging.getLogger(__name__)


def load_draft(config: ExecutorConfig, target: LlamaForCausalLM, target_path: Path, max_model_len: int,
               tp_size: int) -> tuple[LlamaForCausalLM, Path]:
    """(the draft model, its folder) for config.speculative_model; ModelError (one line) for a
    draft this executor cannot use with `target`."""
    if tp_size > 1:
        raise ModelError(f"--speculative-config draft model with --tensor-parallel-size {tp_size}: "
                         "not implemented (draft models run on one device; use 1, or method ngram)")
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    source = model_source.resolve(config.speculative_model, model_source.cache_dir(config.cache_dir), dtype)
    t0 = time.perf_counter()
    hf_config = loader.load_hf_config(source.folder)
    vocab, target_vocab = hf_config.vocab_size, target.args.vocab_size
    if vocab != target_vocab:
        raise ModelError(f"draft model {source.folder}: vocab_size {vocab} differs from the target's "
                         f"{target_vocab} (a draft must share the target's tokenizer)")
    check_same_tokenizer(source.folder, target_path)
    try:
        model_checks.served_max_model_len(hf_config, max_model_len)
    except ModelError as e:
        raise ModelError(f"draft model {source.folder}: {e}") from None
    draft = loader.load_model(source.folder, device, dtype, hf_config, config.quantization)
    log.info("loaded draft model %s in %.2f s (%d layers, hidden %d)", source.folder,
             time.perf_counter() - t0, draft.args.num_layers, draft.args.hidden_size)
    return draft, source.folder


def check_same_tokenizer(draft_path: Path, target_path: Path) -> None:
    """ModelError when both folders have a tokenizer.json and their vocabularies (token ->
    id, added tokens included) differ; folders without one are judged by vocab_size alone."""
    def vocabulary(path: Path) -> dict | None:
        file = path / "tokenizer.json"
        if not file.is_file():
            return None
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelError(f"{file}: cannot read it: {e}") from None
        vocab = dict((data.get("model") or {}).get("vocab") or {})
        vocab.update({t.get("content"): t.get("id") for t in data.get("added_tokens") or ()})
        return vocab

    draft, target = vocabulary(draft_path), vocabulary(target_path)
    if draft is not None and target is not None and draft != target:
        differ = sorted(t for t in set(draft) ^ set(target) if isinstance(t, str))[:3] or sorted(
            (t for t in draft if draft[t] != target.get(t)), key=str)[:3]
        raise ModelError(f"draft model {draft_path}: its tokenizer differs from the target's "
                         f"(e.g. {differ}); a draft must share the target's tokenizer")


def kv_block_bytes(config: ExecutorConfig, target: LlamaForCausalLM, draft: LlamaForCausalLM | None) -> int:
    """Bytes of one KV block of the target, plus the draft's when there is one: the KV budget
    divided by this is the common block count (the memory split in proportion to each
    model's per-token KV bytes)."""
    dtype = kv_cache.cache_dtype(config.kv_cache_dtype, getattr(torch, config.dtype))
    return sum(kv_cache.block_bytes(m.cache_args, config.block_size, dtype) for m in (target, draft) if m is not None)
