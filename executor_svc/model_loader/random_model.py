"""Builds random-weight Hugging Face model folders: the demo model, test models, benchmark models.

A folder holds config.json, generation_config.json, model.safetensors (sharded when large)
and a small byte-level BPE tokenizer trained here on a built-in text, padded with plain
tokens up to the model's vocabulary so every id decodes. Nothing is downloaded. The
weights are random, so the text a model writes is meaningless: these folders exist to
exercise the real loading and serving code at real shapes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

# Shapes of the architectures we serve, at test size and at benchmark size.
SHAPES: dict[str, dict] = {
    "tiny-llama": dict(arch="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=512),
    "tiny-mistral": dict(arch="mistral", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=512),
    "tiny-qwen2": dict(arch="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=512),
    "tiny-qwen3": dict(arch="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, intermediate_size=128, vocab_size=512),
    "demo": dict(arch="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=4, intermediate_size=512, vocab_size=1024),
    # SmolLM2-135M's body with llama-1b's vocabulary (and so its tokenizer): a draft model for it
    "smollm2-135m-draft": dict(arch="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                               num_key_value_heads=3, intermediate_size=1536, vocab_size=128256,
                               tie_word_embeddings=True, rope_theta=100000.0),
    "llama-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                     tie_word_embeddings=True, rope_theta=500000.0),
    "qwen3-0.6b": dict(arch="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0),
    "llama-8b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                     rope_theta=500000.0),
    "llama2-7b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
}

_CONFIG_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}

BOS, EOS = "<|bos|>", "<|eos|>"
ADDED_PADDING = 16  # padding ids kept as added tokens "<|x0|>".. (the tests of added tokens use them)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Serving language models is a matter of "
    "moving bytes: weights and cached keys and values stream from memory every step. "
    "A scheduler batches requests continuously; an executor replays captured graphs. "
    "Hello, world! Numbers 0123456789 and symbols: + - * / = ( ) [ ] { } < > ? ! . , ; : "
    "Unicode: café, naïve, über, 日本語, emoji 🚀 and more text to learn merges from. "
)


def build_tokenizer(folder: Path, vocab_size: int, max_model_len: int) -> None:
    """Trains a byte-level BPE on the built-in text and pads it to exactly vocab_size ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, "<|end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 400), special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    missing = vocab_size - tok.get_vocab_size()
    if missing < 0:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the base tokenizer")
    # Padding as plain vocabulary entries ("<x7>": unreachable by the merges, decodable), and only
    # the last ADDED_PADDING as added tokens: llguidance builds its tokenizer in ~1 s from 128k
    # vocabulary entries, but in ~100 s from 128k added tokens (a start-up's grammar warm-up).
    plain = max(missing - ADDED_PADDING, 0)
    if plain:
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        first = max(vocab.values()) + 1
        vocab.update({f"<x{i}>": first + i for i in range(plain)})
        tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_tokens([f"<|x{i}|>" for i in range(missing - plain)])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "chat_template": CHAT_TEMPLATE,
        "model_max_length": max_model_len, "clean_up_tokenization_spaces": False,
    }, indent=1))


def build_random_model(
    folder: str | os.PathLike, shape: str = "tiny-llama", *, seed: int = 0,
    dtype: torch.dtype = torch.float32, device: str = "cpu", max_position_embeddings: int = 2048,
    shard_bytes: int = 4 << 30, **overrides,
) -> Path:
    """Writes a random-weight model folder of the named shape (see SHAPES); returns its path."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = {**SHAPES[shape], **overrides}
    arch = params.pop("arch")
    config_cls, model_cls = (getattr(transformers, n) for n in _CONFIG_CLASSES[arch])
    build_tokenizer(folder, params["vocab_size"], max_position_embeddings)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    config = config_cls(
        max_position_embeddings=max_position_embeddings, bos_token_id=bos_id, eos_token_id=eos_id,
        torch_dtype=str(dtype).removeprefix("torch."), **params,
    )
    if arch == "qwen2" and "use_sliding_window" not in params:
        config.use_sliding_window = False
    config.save_pretrained(folder)
    transformers.GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id).save_pretrained(folder)

    with torch.device("meta"):
        model = model_cls(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, meta in model.state_dict().items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(meta.shape, generator=gen, device=device)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(meta.shape, generator=gen, device=device)
        else:
            std = 1.0 / meta.shape[-1] ** 0.5 if meta.dim() == 2 else 0.02
            t = std * torch.randn(meta.shape, generator=gen, device=device)
        tensors[name] = t.to(dtype).cpu().contiguous()
    _save_sharded(folder, tensors, shard_bytes)
    return folder


def _save_sharded(folder: Path, tensors: dict[str, torch.Tensor], shard_bytes: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )


def demo_model_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The built-in demo model, created once under the cache folder (~/.cache/llmserve)."""
    base = Path(cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "llmserve"))
    folder = base / "demo-llama"
    if not (folder / "config.json").exists():
        tmp = base / f"demo-llama.tmp{os.getpid()}"
        build_random_model(tmp, "demo", max_position_embeddings=4096)
        if folder.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    return folder
