"""Per-layer FP8 KV-cache scales from a checkpoint (docs/models.md, "FP8 KV cache").

A checkpoint whose quantization_config has a `kv_cache_scheme` (schemes.py checks which) carries
one K and one V scale per decoder layer, the multiplier of the cache (dequantized = fp8 * scale,
so the cache stores x / scale), under the names vLLM reads:

- `model.layers.N.self_attn.k_scale` / `.v_scale` (llm-compressor / compressed-tensors);
- `model.layers.N.self_attn.k_proj.output_scale` / `v_proj.output_scale` (AutoFP8, older
  vLLM-style FP8 checkpoints: the calibrated scale of the projection's output, i.e. of K / V).

Each is a float scalar or [1], finite and > 0. Either every layer has both or the checkpoint has
none; a scale tensor without a kv_cache_scheme is refused (never silently dropped). The scales
are plain floats returned to the loader, which sets them on the model (`model.kv_scales`), not
parameters: start-up decides whether the KV caches use them (kv_cache.checkpoint_scales).
"""

from __future__ import annotations

import math
import re

import torch

from executor_svc.model_loader.checks import ModelError

_NAME = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(?:([kv])_scale|([kv])_proj\.output_scale)$")


def kv_scale_target(name: str) -> tuple[int, str] | None:
    """Checkpoint tensor name -> (layer index, "k" or "v") for a KV-cache scale, else None."""
    m = _NAME.match(name)
    return None if m is None else (int(m.group(1)), m.group(2) or m.group(3))


class KvScaleReader:
    """Collects the checkpoint's KV-cache scales while the loader walks its tensors."""

    def __init__(self, num_layers: int, declared: bool):
        self.num_layers, self.declared = num_layers, declared
        self._found: dict[tuple[int, str], tuple[str, float]] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """One scale tensor (its name matched kv_scale_target); ModelError if it is not usable."""
        layer, which = kv_scale_target(name)
        if not self.declared:
            raise ModelError(f"{name}: a KV-cache scale, but quantization_config has no kv_cache_scheme "
                             f"(refused rather than ignored)")
        if layer >= self.num_layers:
            raise ModelError(f"unexpected weight {name!r}: the model has {self.num_layers} layers")
        if (layer, which) in self._found:
            raise ModelError(f"{name}: layer {layer} already has a {which} scale "
                             f"({self._found[layer, which][0]})")
        self._found[layer, which] = (name, _check_scale(name, tensor))

    def scales(self) -> list[tuple[float, float]] | None:
        """[(k_scale, v_scale)] per layer, or None when the checkpoint has no KV-cache scales;
        ModelError naming the first missing one when only some layers have them."""
        if not self._found:
            return None
        out = []
        for layer in range(self.num_layers):
            pair = []
            for which in ("k", "v"):
                if (layer, which) not in self._found:
                    raise ModelError(f"KV-cache scale model.layers.{layer}.self_attn.{which}_scale missing from "
                                     f"the checkpoint (other layers have theirs)")
                pair.append(self._found[layer, which][1])
            out.append((pair[0], pair[1]))
        return out


def _check_scale(name: str, tensor: torch.Tensor) -> float:
    """A float scalar or [1] tensor, finite, > 0 -> its value (exact in float32)."""
    if tuple(tensor.shape) not in ((), (1,)):
        raise ModelError(f"{name}: shape {tuple(tensor.shape)}: a KV-cache scale is one value per layer "
                         f"(per-tensor; per-head or per-channel KV scales are not supported)")
    if not tensor.is_floating_point() or tensor.dtype.itemsize == 1:
        raise ModelError(f"{name}: dtype {tensor.dtype}: a KV-cache scale must be float32, bf16 or fp16")
    value = float(tensor.float().reshape(()))
    if not (math.isfinite(value) and value > 0):
        raise ModelError(f"{name}: KV-cache scale {value!r}: must be finite and > 0")
    return value
