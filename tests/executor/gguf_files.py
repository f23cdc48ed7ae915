"""Test helper: writes a tiny Hugging Face model folder as a GGUF file, the way llama.cpp's
converter lays it out (metadata keys, tensor names, llama's q/k row interleaving, quantized 2-D
weights), with `gguf`'s own writer and quantizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from executor_svc.model_loader.gguf import _GLOBAL_TENSORS, _LAYER_TENSORS

# the converter's table read backwards (the tensor-by-tensor test against transformers' own GGUF
# loading checks the table itself)
HF_TO_GGUF = {hf: piece for piece, hf in _LAYER_TENSORS.items()}
HF_GLOBALS = {hf: name for name, hf in _GLOBAL_TENSORS.items()}


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_GLOBALS:
        return HF_GLOBALS[hf_name]
    _, _, layer, *rest = hf_name.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{layer}.{HF_TO_GGUF[module]}.{kind}"


def permute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's permutation of llama q/k rows (half-split rope pairs -> interleaved)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_folder: Path, out: Path, arch: str, qtype_name: str = "Q8_0", *,
               file_arch: str | None = None, extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """The model in hf_folder as a GGUF file of architecture `arch`; 2-D weights quantized.

    For files the converter must refuse: file_arch is the architecture written in the file
    (default `arch`); extra_tensors (GGUF name -> array, written as is: float64 becomes F64)
    replace the tensors of the same name or are added."""
    import gguf
    from gguf.quants import quantize

    cfg = json.loads((hf_folder / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), file_arch or arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    writer.add_rope_freq_base(theta)
    writer.add_vocab_size(cfg["vocab_size"])
    _add_tokenizer(writer, hf_folder)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    extra_tensors = dict(extra_tensors or {})
    for name, w in load_file(str(hf_folder / "model.safetensors")).items():
        w = w.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = permute_rope(w, cfg["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        if gguf_name(name) in extra_tensors:
            writer.add_tensor(gguf_name(name), extra_tensors.pop(gguf_name(name)))
        elif w.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name(name), w)
    for name, w in extra_tensors.items():
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_tokenizer(writer, hf_folder: Path) -> None:
    """A byte-level BPE tokenizer.json as GGUF "gpt2" tokenizer metadata."""
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    cfg = json.loads((hf_folder / "tokenizer_config.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    added_plain = {t["content"] for t in tok["added_tokens"] if not t.get("special")}
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    # llama.cpp's types: 3 CONTROL (special), 4 USER_DEFINED (added, not special), 1 NORMAL
    writer.add_token_types([3 if t in special else 4 if t in added_plain else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    writer.add_bos_token_id(vocab[cfg["bos_token"]])
    writer.add_eos_token_id(vocab[cfg["eos_token"]])
    writer.add_add_bos_token(True)
    if cfg.get("chat_template"):
        writer.add_chat_template(cfg["chat_template"])
