"""Loads a Hugging Face model folder into our model: config via transformers (local files only,
checked by model_checks), weights via safetensors; FP8 projections (quantization/) from FP8
checkpoints or quantized at load; a checkpoint's FP8 KV-cache scales (quantization/kv_scales.py)
as `model.kv_scales`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from executor_svc.model_loader import checks as model_checks
from executor_svc.model_loader.checks import ModelError
from executor_svc.models.llama import LlamaForCausalLM, ModelArgs
from executor_svc.parallel import shard, shard_fp8
from executor_svc.parallel.state import SINGLE, TensorParallel
from executor_svc.quantization import fp8, kv_scales, schemes

log = logging.getLogger(__name__)
# checkpoint name piece -> (our fused parameter piece, index of the part in the fused tensor)
_FUSED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def load_hf_config(path: str | Path):
    """The folder's config.json through transformers, local files only (never the Hub); checked
    (model_checks.check_config; a quantization_config other than FP8 weights: schemes.weight_scheme).
    ModelError, one line, for anything we cannot serve."""
    from transformers import AutoConfig

    path = Path(path)
    model_checks.check_model_folder(path)
    model_checks.read_model_type(path)
    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{path / 'config.json'}: transformers cannot read it: {reason}") from None
    model_checks.check_config(cfg)
    schemes.weight_scheme(cfg)
    return cfg


def load_model(path: str | Path, device: str | torch.device, dtype: torch.dtype,
               hf_config=None, quantization: str = "", tp: TensorParallel = SINGLE,
               skinny_max_tokens: int = 0, pdl: bool = False, batch_invariant: bool = False) -> LlamaForCausalLM:
    """Builds the model for the folder's config.json (or hf_config, already loaded) and loads
    its safetensors weights. quantization: --quantization ("" or "fp8"); an FP8 checkpoint is
    FP8 either way. tp: this rank's share only (parallel/shard.py). skinny_max_tokens: the
    skinny-GEMM decode path's bound (models/llama.py; CUDA), off for block-scaled FP8 projections
    (the skinny kernels take per-tensor / per-channel FP8 scales). model.kv_scales: the checkpoint's per-layer
    (k_scale, v_scale) floats, or None (kv_scales.py). batch_invariant: --deterministic's kernels
    (models/llama.py; dense weights only)."""
    path = Path(path)
    cfg = hf_config if hf_config is not None else load_hf_config(path)
    args = ModelArgs.from_hf_config(cfg)
    scheme = schemes.weight_scheme(cfg, quantization)
    if scheme is not None and batch_invariant:
        raise ModelError("--deterministic serves unquantized weights only: this checkpoint's FP8 GEMMs "
                         "are not batch-invariant")
    if scheme is not None and scheme.strategy == "block":
        shard_fp8.check_blocks(args, tp, scheme.block)
    with torch.device("meta"):
        skinny = 0 if scheme is not None and not fp8.Fp8Linear.skinny_fits(scheme.strategy) else skinny_max_tokens
        model = LlamaForCausalLM(args, tp, skinny, pdl,
                                 batch_invariant).to(dtype)
        if scheme is not None:  # after .to(dtype), which would cast the fp8 weights
            fp8.replace_linears(model, scheme, dtype, shard.fused_bounds(args, tp))
    model = model.to_empty(device=device)
    if args.tie_word_embeddings:  # to_empty() unties: tie again
        model.lm_head.weight = model.embed_tokens.weight
    model.cos_sin_cache = model.cos_sin_cache.to(device=device, dtype=torch.float32)
    model.eval().requires_grad_(False)
    reader = kv_scales.KvScaleReader(args.num_layers, schemes.kv_cache_scales_declared(cfg))
    with torch.no_grad():
        load_weights(model, path, scheme, tp, reader)
    model.kv_scales = reader.scales()
    return model


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"--model {path}: no *.safetensors weights in the folder")
    return files


def _target(name: str) -> tuple[str, int | None]:
    """Checkpoint name -> (our parameter name, part index in a fused tensor or None)."""
    name = name.removeprefix("model.")
    for piece, (fused, part) in _FUSED.items():
        if f".{piece}." in name:
            return name.replace(piece, fused), part
    return name, None


def load_weights(model: LlamaForCausalLM, path: Path, scheme: schemes.Fp8Scheme | None = None,
                 tp: TensorParallel = SINGLE, kv_reader: kv_scales.KvScaleReader | None = None) -> None:
    """Copies every checkpoint tensor (tp: this rank's slice of it) into its (possibly fused)
    parameter; checks nothing is missing. With an FP8 scheme, the projections' weights and
    scales (tp: the rank's slices, parallel/shard_fp8.py) go through Fp8Linear.load; KV-cache scales (one value per layer, the same on every
    rank) go to kv_reader (None: refused, as without a kv_cache_scheme)."""
    args = model.args
    params, modules = dict(model.named_parameters()), dict(model.named_modules())
    offsets = shard.fused_bounds(args, tp)  # the rank's fused parts
    loaded: set[str] = set()
    kv_reader = kv_reader or kv_scales.KvScaleReader(args.num_layers, declared=False)
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for ckpt_name in f.keys():
                if kv_scales.kv_scale_target(ckpt_name) is not None:  # before _target: k_proj.output_scale
                    kv_reader.add(ckpt_name, f.get_tensor(ckpt_name))
                    continue
                name, part = _target(ckpt_name)
                if name == "lm_head.weight" and args.tie_word_embeddings:
                    continue
                owner, _, leaf = name.rpartition(".")
                if scheme is not None and scheme.static_input_scales and leaf in fp8.INPUT_SCALE_NAMES:
                    continue  # static activation scales: the activations stay in the compute dtype
                module = modules.get(owner)
                bounds = offsets.get(owner.rpartition(".")[2]) if part is not None else None
                rows = None if bounds is None else (bounds[part], bounds[part + 1])
                suffix = "" if part is None else f"#{part}"
                if isinstance(module, fp8.Fp8Linear) and leaf in ("weight", *fp8.SCALE_NAMES):
                    filled = shard_fp8.load(module, leaf, f.get_tensor(ckpt_name), rows, not scheme.pre_quantized,
                                            name, part, args, tp, ckpt_name)
                    loaded.update(f"{owner}.{p}{suffix}" for p in filled)
                    continue
                if name not in params:
                    raise ModelError(f"unexpected weight {ckpt_name!r} in {file.name}")
                param = params[name] if rows is None else params[name][rows[0]:rows[1]]
                tensor = shard.shard_tensor(name, part, f.get_tensor(ckpt_name), args, tp)
                if tensor.shape != param.shape:
                    raise ModelError(f"{ckpt_name}: shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                if tensor.dtype.itemsize == 1 and tensor.is_floating_point():
                    raise ModelError(f"{ckpt_name}: {tensor.dtype} weights where the config has no FP8 "
                                     f"quantization for this tensor (refused, not cast)")
                param.copy_(tensor)
                loaded.add(name + suffix)
    _check_complete(model, loaded)


def _check_complete(model: LlamaForCausalLM, loaded: set[str]) -> None:
    expected = set()
    for name, _ in model.named_parameters():  # a tied lm_head is not listed (shared parameter)
        fused = name.split(".")[-2] if name.count(".") >= 1 else ""
        parts = {"qkv_proj": 3, "gate_up_proj": 2}.get(fused)
        expected.update([f"{name}#{i}" for i in range(parts)] if parts else [name])
    if "lm_head.weight" in expected and "lm_head.weight" not in loaded and "embed_tokens.weight" in loaded:
        # no lm_head in the file: tie it to the embeddings (some checkpoints omit it)
        model.lm_head.weight = model.embed_tokens.weight
        expected.discard("lm_head.weight")
    missing = expected - loaded
    if missing:
        raise ModelError(f"weights missing from the checkpoint: {sorted(missing)[:8]}")


def eos_token_ids(path: str | Path, hf_config) -> list[int]:
    """EOS ids from generation_config.json, else config.json; always a list."""
    eos = None
    gen_file = Path(path) / "generation_config.json"
    if gen_file.exists():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
