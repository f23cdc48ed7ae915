"""Writes FP8 checkpoints of a random model folder, in each format the loader accepts, next to a
plain float32 checkpoint of the same (dequantized) weights: the two must give the same logits;
add_kv_scales gives an FP8 folder per-layer KV-cache scales (kv_cache_scheme).

The quantization here is written independently of executor_svc/quantization (tile loops, not
the loader's broadcasting), so a scale applied wrongly by the loader shows as a mismatch.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8, FP8_MAX = torch.float8_e4m3fn, 448.0
PROJECTION = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")
BLOCK = [32, 48]  # divides every fused part of the tiny shapes (q 64, k/v 32, gate/up 128); 48 leaves partial K tiles


def compressed_config(strategy: str, input_activations: dict | None, weights: dict | None = None) -> dict:
    """A compressed-tensors quantization_config (float-quantized, lm_head ignored), as llm-compressor writes it."""
    weights = weights if weights is not None else {
        "num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False,
        "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": input_activations, "output_activations": None}},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}}


DYNAMIC_TOKENS = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
STATIC_TENSOR = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}

# format -> (quantization_config, weight scale kind, scale tensor name, scale dtype, input scale tensor name)
FORMATS = {
    "fp8-tensor": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None},
                   "tensor", "weight_scale_inv", torch.float32, None),
    "fp8-tensor-static": ({"quant_method": "fp8", "activation_scheme": "static"},
                          "tensor", "weight_scale", torch.float32, "input_scale"),
    "fp8-block": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": BLOCK},
                  "block", "weight_scale_inv", torch.float32, None),
    "ct-tensor": (compressed_config("tensor", STATIC_TENSOR), "tensor", "weight_scale", torch.float32, "input_scale"),
    "ct-channel": (compressed_config("channel", DYNAMIC_TOKENS), "channel", "weight_scale", torch.bfloat16, None),
}


def quantize_tiles(w: torch.Tensor, rows: int, cols: int, scale_dtype: torch.dtype):
    """w [N, K] -> (fp8 [N, K], scales [ceil(N/rows), ceil(K/cols)], dequantized float32 [N, K]),
    one scale per tile (the scale rounded to scale_dtype before use, as a stored scale is)."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=FP8)
    deq = torch.empty(n, k)
    scales = torch.empty(-(-n // rows), -(-k // cols), dtype=scale_dtype)
    for i in range(0, n, rows):
        for j in range(0, k, cols):
            tile = w[i:i + rows, j:j + cols]
            scale = (tile.abs().max() / FP8_MAX).to(scale_dtype)
            scales[i // rows, j // cols] = scale
            q[i:i + rows, j:j + cols] = (tile / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            deq[i:i + rows, j:j + cols] = q[i:i + rows, j:j + cols].float() * scale.float()
    return q, scales, deq


def quantize(w: torch.Tensor, kind: str, scale_dtype: torch.dtype, block=BLOCK):
    """(fp8 weight, scale tensor as the format stores it, dequantized weight) of one projection."""
    n, k = w.shape
    if kind == "tensor":
        q, scales, deq = quantize_tiles(w, n, k, scale_dtype)
        return q, scales.reshape(()), deq
    if kind == "channel":
        q, scales, deq = quantize_tiles(w, 1, k, scale_dtype)
        return q, scales.reshape(n, 1), deq
    return quantize_tiles(w, block[0], block[1], scale_dtype)


def write_fp8_pair(src: Path, base: Path, fmt: str, weight_dtype: torch.dtype = FP8,
                   block: list[int] | None = None) -> tuple[Path, Path]:
    """(FP8 folder in `fmt`, float32 folder of its dequantized weights) made from the model at src.
    Each projection is first scaled by its own factor, so that parts of a fused weight have very
    different scales (a scale used for the wrong part changes the logits). block: another
    weight_block_size than BLOCK (block formats)."""
    config, kind, scale_name, scale_dtype, input_scale = FORMATS[fmt]
    if block is not None:
        config = {**config, "weight_block_size": block}
    tensors = load_file(str(src / "model.safetensors"))
    quantized, dense = {}, {}
    for i, (name, t) in enumerate(sorted(tensors.items())):
        if not PROJECTION.search(name):
            quantized[name] = dense[name] = t
            continue
        q, scale, deq = quantize(t * (0.25 + 0.5 * (i % 7)), kind, scale_dtype, block or BLOCK)
        prefix = name.removesuffix("weight")
        if fmt.startswith("ct") and kind == "tensor":
            scale = scale.reshape(1)  # compressed-tensors keeps per-tensor scales as [1]
        quantized[name], quantized[prefix + scale_name], dense[name] = q.to(weight_dtype), scale, deq
        if input_scale:  # a static activation scale: loaded and ignored
            quantized[prefix + input_scale] = torch.tensor([0.05] if fmt.startswith("ct") else 0.05)
    fp8_dir = _copy_folder(src, base / fmt, quantization_config=config)
    ref_dir = _copy_folder(src, base / f"{fmt}-dequantized")
    save_file(quantized, str(fp8_dir / "model.safetensors"))
    save_file(dense, str(ref_dir / "model.safetensors"))
    return fp8_dir, ref_dir


KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True,
                   "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                   "observer_kwargs": {}}  # as llm-compressor writes it
# KV-scale tensor names per layer: llm-compressor's, and AutoFP8's (the k/v projections' output scales)
KV_SCALE_NAMES = {"attn": ("self_attn.k_scale", "self_attn.v_scale"),
                  "output": ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")}


def shrink_kv(src: Path, dst: Path, factor: float = 256.0) -> Path:
    """A copy of the model at src computing the same function (exactly: factor is a power of 2)
    with K and V `factor` times smaller: k/v_proj divided by it, q_proj and o_proj multiplied
    (scores q.k and o_proj(attention of v) unchanged). Not for q/k-normed models (qwen3)."""
    tensors = load_file(str(src / "model.safetensors"))
    for name, t in tensors.items():
        if re.search(r"\.(k|v)_proj\.", name):
            tensors[name] = t / factor
        elif re.search(r"\.q_proj\.|\.o_proj\.weight$", name):
            tensors[name] = t * factor
    folder = _copy_folder(src, dst)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def add_kv_scales(folder: Path, scales: list[tuple[float, float]], names: str = "attn", shape: tuple = (),
                  scheme=KV_CACHE_SCHEME) -> None:
    """Adds per-layer FP8 KV-cache scales (k, v) to an FP8 folder of write_fp8_pair, in place:
    the tensors (float32, `shape` () or (1,)) and kv_cache_scheme in its quantization_config
    (`scheme`; a quant_method "fp8" config gets AutoFP8's "static" instead)."""
    tensors = load_file(str(folder / "model.safetensors"))
    for layer, pair in enumerate(scales):
        for name, value in zip(KV_SCALE_NAMES[names], pair):
            tensors[f"model.layers.{layer}.{name}"] = torch.full(shape, value, dtype=torch.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    quant = config["quantization_config"]
    quant["kv_cache_scheme"] = "static" if quant["quant_method"] == "fp8" else scheme
    (folder / "config.json").write_text(json.dumps(config))


def _copy_folder(src: Path, dst: Path, **config_fields) -> Path:
    """src without its weights, config.json updated with config_fields."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config.update(config_fields)
    (dst / "config.json").write_text(json.dumps(config))
    return dst
