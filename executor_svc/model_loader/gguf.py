"""GGUF model files (llama.cpp's format) turned into a normal Hugging Face folder, once.

The file is read with `gguf` (llama.cpp's own Python reader), every tensor is dequantized with
its `gguf.quants`, renamed to the Hugging Face layout and saved as safetensors next to a
config.json built from the file's metadata; the tokenizer and chat template come from the
metadata too (through transformers' GGUF tokenizer conversion). The folder is cached under a
key made of the file's SHA-256 and the dtype, so the next start just loads it. Only the
Llama family is converted (GGUF architectures llama — Mistral files use it too — qwen2, qwen3);
anything else, or a tensor type `gguf` cannot dequantize, is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from executor_svc.model_loader.checks import ModelError

log = logging.getLogger(__name__)

CONVERTER_VERSION = 3  # part of the cache key: bump when the conversion changes
# GGUF architecture -> (HF model_type, HF architecture class)
ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
# GGUF tensor name piece -> Hugging Face name piece (per layer: blk.N.<piece> -> model.layers.N.<hf>)
_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


class GGUFError(ModelError):
    """A GGUF file this server cannot serve (the message names what and why)."""


def find_gguf(path: Path) -> Path | None:
    """The .gguf file `path` names (a file, or a folder holding exactly one); None otherwise."""
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(path.glob("*.gguf"))
        if len(files) > 1:
            raise GGUFError(f"{path} holds {len(files)} .gguf files; name one: --model {files[0]}")
        return files[0] if files else None
    return None


def converted_folder(gguf_path: Path, cache_dir: Path, dtype: torch.dtype) -> Path:
    """The Hugging Face folder for gguf_path, converting (and caching) it on first use."""
    digest = _sha256(gguf_path)
    folder = cache_dir / "gguf" / f"{digest[:24]}-{str(dtype).removeprefix('torch.')}-v{CONVERTER_VERSION}"
    if (folder / "config.json").exists():
        log.info("GGUF %s: using the converted model in %s", gguf_path.name, folder)
        return folder
    t0 = time.perf_counter()
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        summary = convert(gguf_path, tmp, dtype)
        if folder.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("GGUF %s (%s) converted to %s in %s in %.1f s", gguf_path.name, summary,
             str(dtype).removeprefix("torch."), folder, time.perf_counter() - t0)
    return folder


def convert(gguf_path: Path, out: Path, dtype: torch.dtype) -> str:
    """Writes config.json, model.safetensors, the tokenizer files and generation_config.json
    of gguf_path into `out`; returns a one-line summary (architecture, tensor types)."""
    import gguf
    from safetensors.torch import save_file

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (ValueError, OSError, IndexError) as e:  # not GGUF, truncated, empty
        raise GGUFError(f"{gguf_path.name}: not a readable GGUF file ({e})") from None
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{gguf_path.name}: GGUF architecture {arch!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    config = hf_config(meta, arch, {t.name for t in reader.tensors}, dtype)
    tensors, types = {}, set()
    for tensor in reader.tensors:
        types.add(tensor.tensor_type.name)
        name = hf_tensor_name(tensor.name)
        weights = _dequantize(gguf_path.name, tensor)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            weights = unpermute_rope(weights, heads)  # llama.cpp interleaves llama's q/k rows
        tensors[name] = torch.from_numpy(np.require(weights, requirements=["C", "W"])).to(dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}, indent=1))
    _write_tokenizer(gguf_path, out, num_tokens=len(meta.require("tokenizer.ggml.tokens")))
    return f"{arch}, {len(tensors)} tensors of {'/'.join(sorted(types))}"


def hf_config(meta: "_Metadata", arch: str, tensor_names: set[str], dtype: torch.dtype) -> dict:
    """config.json of the Hugging Face model the GGUF metadata describes."""
    model_type, architecture = ARCHITECTURES[arch]
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    heads = meta.require(key("attention.head_count"))
    hidden = meta.require(key("embedding_length"))
    config = {
        "architectures": [architecture], "model_type": model_type,
        "hidden_size": hidden, "intermediate_size": meta.require(key("feed_forward_length")),
        "num_hidden_layers": meta.require(key("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": meta.get(key("attention.head_count_kv"), heads),
        "head_dim": meta.get(key("attention.key_length"), hidden // heads),
        "rms_norm_eps": meta.get(key("attention.layer_norm_rms_epsilon"), 1e-6),
        "rope_theta": meta.get(key("rope.freq_base"), 10000.0),
        "max_position_embeddings": meta.require(key("context_length")),
        "vocab_size": meta.get(key("vocab_size")) or len(meta.require("tokenizer.ggml.tokens")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu", "torch_dtype": str(dtype).removeprefix("torch."),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get(key("rope.scaling.type"))
    if scaling not in (None, "none"):
        # written as found: the loader refuses rope scalings the model code does not implement
        config["rope_scaling"] = {"rope_type": scaling,
                                  "factor": meta.get(key("rope.scaling.factor"), 1.0)}
        original = meta.get(key("rope.scaling.original_context_length"))
        if original is not None:
            config["rope_scaling"]["original_max_position_embeddings"] = int(original)
        elif scaling == "yarn":  # transformers would guess it from the context length: refuse
            raise GGUFError("rope scaling yarn without rope.scaling.original_context_length in the "
                            "GGUF metadata: the original context cannot be known")
    if "rope_freqs.weight" in tensor_names:
        raise GGUFError("per-dimension rope frequencies (rope_freqs.weight, Llama 3.1-style rope "
                        "scaling in GGUF) are not supported; serve the Hugging Face folder instead")
    if arch == "qwen2":
        config["attention_bias"] = True  # Qwen2 has q/k/v biases
    return config


def hf_tensor_name(name: str) -> str:
    """GGUF tensor name -> Hugging Face parameter name (blk.3.attn_q.bias -> model.layers.3.self_attn.q_proj.bias)."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{parts[3]}"
    raise GGUFError(f"GGUF tensor {name!r} has no counterpart in the Llama-family model")


def unpermute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's conversion permutation of llama q/k rows (interleaved rope pairs back
    to the Hugging Face half-split layout); works for weights [out, in] and biases [out]."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Metadata:
    """Key/value metadata of a GGUF file, as Python values."""

    def __init__(self, reader):
        self._fields = reader.fields

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise GGUFError(f"the GGUF file has no {key!r} metadata")
        return value


def _dequantize(file_name: str, tensor) -> np.ndarray:
    from gguf.quants import dequantize

    try:
        return dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    except NotImplementedError:
        raise GGUFError(f"{file_name}: tensor {tensor.name} uses quantization type "
                        f"{tensor.tensor_type.name}, which cannot be dequantized here") from None


def _write_tokenizer(gguf_path: Path, out: Path, num_tokens: int) -> None:
    """tokenizer.json, tokenizer_config.json and the chat template, from the GGUF metadata."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer.json").exists():
        raise GGUFError(f"{gguf_path.name}: its tokenizer could not be converted to tokenizer.json")
    _drop_tokens_past(out / "tokenizer.json", num_tokens)


def _drop_tokens_past(tokenizer_json: Path, num_tokens: int) -> None:
    """Removes added tokens with ids the file's vocabulary lacks: transformers' byte-level GGUF
    tokenizer adds GPT-2's default <|endoftext|> to a vocabulary without it, as a new id past
    the model's embeddings (the special tokens the file names are set separately)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    kept = [t for t in data["added_tokens"] if t["id"] < num_tokens]
    if len(kept) < len(data["added_tokens"]):
        data["added_tokens"] = kept
        tokenizer_json.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()
