"""Which quantization configs we serve: FP8 (e4m3) weights, read from config.json's
`quantization_config` or asked for with `--quantization fp8`; everything else is refused.

Two checkpoint formats (tensor names per linear layer, `<layer>.weight` float8_e4m3fn [N, K]):

- `quant_method: "fp8"` (transformers' FineGrainedFP8 / vLLM's Fp8Config):
  `weight_block_size: [bn, bk]` -> `weight_scale_inv` [ceil(N/bn), ceil(K/bk)];
  absent or null -> one per-tensor scale, `weight_scale` or `weight_scale_inv` (vLLM reads
  absent as per-tensor; transformers would assume [128, 128], whose scale shape the loader
  would then refuse). Both names hold the multiplier: weight = fp8 * scale. `activation_scheme:
  "static"` adds `input_scale` / `activation_scale` tensors.
- `quant_method: "compressed-tensors"`, `format: "float-quantized"` (or "naive-quantized"):
  config_groups targeting "Linear" with weights {num_bits: 8, type: "float", strategy:
  "tensor" | "channel", symmetric} -> `weight_scale` [1] or [N, 1]; weight = fp8 * scale.
  `ignore` (usually lm_head) stays unquantized. Static input activations add `input_scale`.

FP8 KV-cache scales (`kv_cache_scheme`, kv_scales.py reads the tensors): compressed-tensors'
{num_bits: 8, type: "float", strategy: "tensor", dynamic: false, symmetric: true} (what
llm-compressor writes), or `kv_cache_scheme: "static"` in a `quant_method: "fp8"` config
(AutoFP8); any other kv_cache_scheme is refused. `kv_cache_scales_declared` tells the loader.

Static input scales are loaded and ignored: they quantize the *activations* to fp8 before the
GEMM, a rounding (and clipping) step that only approximates the unquantized activations the
checkpoint was calibrated against. Our activations stay in the compute dtype, so the product
is the weight-only one, closer to the original model than a W8A8 engine's (not bit-equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from executor_svc.model_loader.checks import ModelError

QUANTIZATION_CHOICES = ("", "fp8")  # --quantization (vLLM's flag)
# the projections of one decoder layer, as checkpoints name them (model.layers.{i}.<this>)
LINEAR_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_SUPPORTED = ("served: FP8 e4m3 weights, quant_method 'fp8' or 'compressed-tensors' float-quantized, "
              "or --quantization fp8 on an unquantized checkpoint")
_CT_FORMATS = ("float-quantized", "naive-quantized")
_CT_STRATEGIES = ("tensor", "channel")


@dataclass(frozen=True)
class Fp8Scheme:
    """How every linear weight (qkv, o, gate_up, down) of an FP8 model is scaled."""

    strategy: str  # "tensor": one scale, "channel": one per output row, "block": per [bn, bk] tile
    block: tuple[int, int] | None = None  # (bn, bk) of strategy "block"
    pre_quantized: bool = True  # False: quantized at load from a bf16/fp32 checkpoint
    static_input_scales: bool = False  # the files carry input scales (loaded and ignored)


QUANTIZE_AT_LOAD = Fp8Scheme("channel", pre_quantized=False)  # per output channel, as vLLM does


def weight_scheme(cfg, flag: str = "") -> Fp8Scheme | None:
    """The FP8 scheme of the model: from its quantization_config, else from --quantization
    (`flag`); None = unquantized. ModelError (one line) for any config not served."""
    if flag not in QUANTIZATION_CHOICES:
        raise ModelError(f"--quantization {flag!r}: not supported (choices: fp8, or none)")
    raw = getattr(cfg, "quantization_config", None)
    if raw is None:
        return QUANTIZE_AT_LOAD if flag == "fp8" else None
    raw = raw if isinstance(raw, dict) else raw.to_dict()
    method = raw.get("quant_method")
    if method == "fp8":
        return _native_fp8(raw, cfg.num_hidden_layers)
    if method == "compressed-tensors":
        return _compressed_tensors(raw, cfg.num_hidden_layers)
    raise ModelError(f"quantization_config={_brief(raw)}: quant_method {method!r} is not supported ({_SUPPORTED})")


def _native_fp8(raw: dict, num_layers: int) -> Fp8Scheme:
    """transformers'/vLLM's `quant_method: "fp8"`: per-tensor, or block-wise with weight_block_size."""
    where = "quantization_config (quant_method 'fp8')"
    fmt = raw.get("fmt", "e4m3")
    _refuse_if(fmt != "e4m3", f"{where}: fmt={fmt!r}: only float8 e4m3 weights are supported")
    activations = raw.get("activation_scheme", "dynamic")
    _refuse_if(activations not in ("dynamic", "static"), f"{where}: activation_scheme={activations!r} is not supported")
    scale_fmt = raw.get("scale_fmt", "float")
    _refuse_if(scale_fmt != "float", f"{where}: scale_fmt={scale_fmt!r}: only float32 scales are supported")
    _refuse_if(bool(raw.get("modules_to_convert")),
               f"{where}: modules_to_convert={raw.get('modules_to_convert')!r}: only linear layers are quantized here")
    for key in ("modules_to_not_convert", "ignored_layers"):
        _check_ignored(raw.get(key) or (), num_layers, f"{where}: {key}")
    kv = raw.get("kv_cache_scheme")
    _refuse_if(kv not in (None, "static"), f"{where}: kv_cache_scheme={kv!r} is not supported "
               f"(supported: 'static', per-layer FP8 k/v scales)")
    block = raw.get("weight_block_size")
    static = activations == "static"
    if block is None:
        return Fp8Scheme("tensor", static_input_scales=static)
    _refuse_if(not (isinstance(block, (list, tuple)) and len(block) == 2
                    and all(isinstance(b, int) and b > 0 for b in block)),
               f"{where}: weight_block_size={block!r}: two positive ints are needed")
    return Fp8Scheme("block", block=(block[0], block[1]), static_input_scales=static)


def _compressed_tensors(raw: dict, num_layers: int) -> Fp8Scheme:
    """compressed-tensors float-quantized: every group's weights one FP8 tensor/channel scheme."""
    where = "quantization_config (compressed-tensors)"
    fmt = raw.get("format")
    _refuse_if(fmt not in _CT_FORMATS, f"{where}: format={fmt!r} is not supported (supported: {', '.join(_CT_FORMATS)})")
    for key in ("sparsity_config", "transform_config"):
        _refuse_if(bool(raw.get(key)), f"{where}: {key} is not supported (only FP8 weights are)")
    _check_ct_kv_cache_scheme(raw.get("kv_cache_scheme"), where)
    groups = raw.get("config_groups") or {}
    _refuse_if(not groups, f"{where}: no config_groups")
    schemes = {_ct_group(f"{where}: config_groups.{name}", group) for name, group in groups.items()}
    _refuse_if(len(schemes) > 1, f"{where}: config_groups with different weight schemes are not supported")
    _check_ignored(raw.get("ignore") or (), num_layers, f"{where}: ignore")
    return schemes.pop()


def kv_cache_scales_declared(cfg) -> bool:
    """Whether the (already checked) quantization_config declares static per-layer FP8 KV-cache
    scales, i.e. whether the checkpoint may carry k/v scale tensors."""
    raw = getattr(cfg, "quantization_config", None)
    if raw is None:
        return False
    raw = raw if isinstance(raw, dict) else raw.to_dict()
    return bool(raw.get("kv_cache_scheme"))


def _check_ct_kv_cache_scheme(kv, where: str) -> None:
    """compressed-tensors' kv_cache_scheme: absent, or static symmetric per-tensor 8-bit float."""
    if not kv:
        return
    where = f"{where}: kv_cache_scheme"
    _refuse_if(not isinstance(kv, dict), f"{where}={kv!r} is not supported")
    kind, bits = kv.get("type"), kv.get("num_bits")
    _refuse_if((kind, bits) != ("float", 8), f"{where} type={kind!r} num_bits={bits!r}: only 8-bit float "
               f"(e4m3) KV caches are supported")
    strategy = kv.get("strategy")
    _refuse_if(strategy != "tensor", f"{where} strategy={strategy!r} is not supported (supported: 'tensor', "
               f"one k and one v scale per layer)")
    for key, expected in (("dynamic", False), ("symmetric", True)):
        value = kv.get(key, expected)
        _refuse_if(value != expected, f"{where} {key}={value!r} is not supported (static symmetric scales only)")
    for key in ("group_size", "block_structure"):
        _refuse_if(kv.get(key) is not None, f"{where} {key}={kv.get(key)!r} is not supported")


def _ct_group(where: str, group: dict) -> Fp8Scheme:
    """One compressed-tensors config group -> its scheme; refuses anything but FP8 weights on Linear."""
    targets = group.get("targets") or []
    _refuse_if("Linear" not in targets, f"{where}: targets={targets!r}: only groups targeting 'Linear' are supported")
    weights = group.get("weights")
    _refuse_if(not weights, f"{where}: activation-only quantization (no weights scheme) is not supported")
    kind, bits = weights.get("type"), weights.get("num_bits")
    _refuse_if((kind, bits) != ("float", 8),
               f"{where}: weights type={kind!r} num_bits={bits!r}: only 8-bit float (e4m3) weights are supported")
    strategy = weights.get("strategy")
    _refuse_if(strategy not in _CT_STRATEGIES,
               f"{where}: weights strategy={strategy!r} is not supported (supported: {', '.join(_CT_STRATEGIES)})")
    for key, expected in (("symmetric", True), ("dynamic", False)):
        value = weights.get(key, expected)
        _refuse_if(value != expected, f"{where}: weights {key}={value!r} is not supported")
    for key in ("group_size", "block_structure", "actorder"):
        _refuse_if(weights.get(key) is not None, f"{where}: weights {key}={weights.get(key)!r} is not supported")
    _refuse_if(group.get("output_activations") is not None, f"{where}: output_activations are not supported")
    inputs = group.get("input_activations")
    if inputs is not None:
        kind, bits = inputs.get("type"), inputs.get("num_bits")
        _refuse_if((kind, bits) != ("float", 8),
                   f"{where}: input_activations type={kind!r} num_bits={bits!r} are not supported")
    static = inputs is not None and not inputs.get("dynamic", False)
    return Fp8Scheme(strategy, static_input_scales=static)


def _check_ignored(entries, num_layers: int, where: str) -> None:
    """An ignore list may name lm_head (or other layers we do not have), never one of our
    quantized projections: mixing FP8 and dense projections is not implemented."""
    names = [f"model.layers.{i}.{part}" for i in range(num_layers) for part in LINEAR_PARTS]
    for entry in entries:
        hit = next((n for n in names if _matches(str(entry), n)), None)
        _refuse_if(hit is not None, f"{where} lists {entry!r}, which covers {hit}: unquantized projections "
                   f"in an FP8 model are not supported")


def _matches(entry: str, name: str) -> bool:
    """compressed-tensors' matching: "re:<pattern>" matches the module name from its start;
    a plain entry the name itself (or its last pieces)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return name == entry or name.endswith("." + entry)


def _refuse_if(condition: bool, message: str) -> None:
    if condition:
        raise ModelError(message)


def _brief(raw: dict) -> str:
    return repr(raw.get("quant_method", "?"))
