"""What the executor refuses to serve, said in one line at start-up.

A `--model` that is not a folder with config.json, and a config whose fields change the
outputs in ways models/llama.py does not implement (rope types other than default, linear,
dynamic, yarn and llama3, per-layer-type rope, partial rotary, biases we do not have, another
activation, ...; quantization_config: quantization/schemes.py). Served anyway,
such a model would not fail: it would answer with plausible wrong text. Each refusal names
the field and its value. Nothing here touches the network.
"""

from __future__ import annotations

import json
from pathlib import Path

# config.model_type of the families we serve (LlamaForCausalLM, MistralForCausalLM, ...)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
IMPLEMENTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")  # layers.rope_inv_freq
SILU = ("silu", "swish")  # the one activation of layers.silu_and_mul (transformers: same function)
_WINDOWED_TYPES = ("mistral", "qwen2", "qwen3")  # where transformers applies sliding_window
_LAYER_TYPES = ("full_attention", "sliding_attention")


class ModelError(ValueError):
    """The model cannot be served as asked; the message is one line naming the path or field."""


def check_model_folder(path: Path) -> None:
    """A local folder holding config.json; a hub id is not looked up (nothing is downloaded)."""
    if not path.exists():
        raise ModelError(f"--model {path}: no such folder (a local Hugging Face model folder with "
                         f"config.json is needed; nothing is downloaded)")
    if not path.is_dir():
        raise ModelError(f"--model {path}: not a folder (a Hugging Face model folder with config.json is needed)")
    if not (path / "config.json").is_file():
        raise ModelError(f"--model {path}: the folder has no config.json")


def read_model_type(path: Path) -> str:
    """config.json's model_type, checked against the families we serve before transformers
    parses it (an unknown type would otherwise fail deep inside AutoConfig)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path / 'config.json'}: cannot be read: {e}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"unsupported model_type {model_type!r} in {path / 'config.json'} "
                         f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return model_type


def check_config(cfg) -> None:
    """Refuses every config field that would change outputs and is not implemented."""
    model_type = cfg.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    act = getattr(cfg, "hidden_act", "silu")
    _refuse_if(act not in SILU, f"hidden_act={act!r}: only silu is implemented")
    # transformers puts attention_bias on q, k, v and o of llama and qwen3; we have a qkv bias
    # (qwen2's, always on) and no o_proj bias. Mistral's attention ignores the field.
    _refuse_if(model_type in ("llama", "qwen3") and getattr(cfg, "attention_bias", False),
               "attention_bias=True: attention projection biases are not implemented")
    _refuse_if(getattr(cfg, "mlp_bias", False), "mlp_bias=True: MLP biases are not implemented")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = getattr(cfg, name, None)
        _refuse_if(value is not None, f"{name}={value}: logit soft-capping is not implemented")
    heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    _refuse_if(heads % kv_heads != 0,
               f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    _check_rope(cfg)
    if model_type in _WINDOWED_TYPES and model_type != "mistral":
        kinds = set(getattr(cfg, "layer_types", None) or ()) - set(_LAYER_TYPES)
        _refuse_if(bool(kinds), f"layer_types with {sorted(kinds)}: only full and sliding attention exist here")


def rope_parameters(cfg) -> dict:
    """The rope settings however the transformers version names them (rope_parameters since
    v5, rope_scaling before); {} = default rope."""
    return dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})


def _check_rope(cfg) -> None:
    rope = rope_parameters(cfg)
    _refuse_if(any(isinstance(v, dict) for v in rope.values()),
               f"rope_parameters per layer type ({sorted(rope)}): not implemented")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    _refuse_if(rope_type not in IMPLEMENTED_ROPE_TYPES,
               f"rope_scaling rope_type={rope_type!r}: not implemented (implemented: "
               f"{', '.join(IMPLEMENTED_ROPE_TYPES)})")
    factor = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
    _refuse_if(factor not in (None, 1, 1.0), f"partial_rotary_factor={factor}: partial rotary embeddings are not implemented")


def layer_windows(cfg) -> tuple[int, ...]:
    """The attention window transformers applies in each layer, 0 = full attention. Mistral
    slides in every layer when sliding_window is set; Qwen2/Qwen3 in the layers layer_types
    marks "sliding_attention" (older transformers: from max_window_layers on, if
    use_sliding_window), and only when the config keeps a sliding_window."""
    window = getattr(cfg, "sliding_window", None)
    num_layers = cfg.num_hidden_layers
    if window is None or cfg.model_type not in _WINDOWED_TYPES:
        return (0,) * num_layers
    if cfg.model_type == "mistral":
        return (int(window),) * num_layers
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is None:
        use = bool(getattr(cfg, "use_sliding_window", False))
        first = getattr(cfg, "max_window_layers", 0)
        return tuple(int(window) if use and i >= first else 0 for i in range(num_layers))
    return tuple(int(window) if kind == "sliding_attention" else 0 for kind in layer_types)


def sliding_window(cfg) -> int | None:
    """The window of the sliding layers (one per config); None = full attention in every layer."""
    windows = [w for w in layer_windows(cfg) if w]
    return windows[0] if windows else None


def rope_max_positions(cfg) -> int:
    """Positions the rotary table covers: max_position_embeddings, or for yarn the length it
    was scaled to (original_max_position_embeddings * factor, e.g. Qwen2.5's 4 x 32768)."""
    rope = rope_parameters(cfg)
    max_positions = cfg.max_position_embeddings
    if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("factor"):
        old_len = rope.get("original_max_position_embeddings", max_positions)
        return max(max_positions, int(old_len * rope["factor"]))
    return max_positions


def served_max_model_len(cfg, requested: int) -> int:
    """Most tokens per request: `requested` (--max-model-len; 0 = max_position_embeddings).

    A longer one than the rotary table (rope_max_positions) is refused. Dynamic NTK rope is
    exact up to max_position_embeddings only: past it transformers rescales the frequencies of
    a whole forward from its last position, which one table per position cannot give a
    prompt that is longer (docs/models.md)."""
    max_positions = cfg.max_position_embeddings
    if not requested:
        return max_positions
    rope = rope_parameters(cfg)
    if rope.get("rope_type", rope.get("type")) == "dynamic":
        _refuse_if(requested > max_positions,
                   f"rope_type='dynamic': --max-model-len {requested} > max_position_embeddings="
                   f"{max_positions} is not implemented (exact only that far)")
    limit = rope_max_positions(cfg)
    _refuse_if(requested > limit, f"--max-model-len {requested} > max_position_embeddings={max_positions} "
               f"of the model" + (f" (rope scaled to {limit})" if limit != max_positions else ""))
    return requested


def _refuse_if(condition: bool, message: str) -> None:
    if condition:
        raise ModelError(message)
