"""Fp8Linear: a linear layer whose weight is float8_e4m3fn [N, K] with float32 scales, and the
helpers that put it in a model and fill it from checkpoint tensors.

Scales (`weight_scale`, the multiplier: weight ~ fp8 * scale):
- "tensor": [1], one scale for the whole weight;
- "channel": [N], one per output row; also what fused qkv_proj / gate_up_proj hold for a
  per-tensor checkpoint, each part's scalar repeated over its rows (exact);
- "block": [ceil(N/bn), ceil(K/bk)], one per (bn, bk) tile (the last tiles may be partial).

Forward is `kernels.fp8_linear` (kernels/fp8_gemm.py, docs/kernels.md "FP8 GEMMs"): on CUDA a
weight-only FP8 GEMM dequantizing in registers for <= 64 rows (bandwidth-bound decode: reads the
fp8 weight once) and, beyond, dynamic per-token (per-group for block weights) FP8 activations on
the tensor cores (`torch._scaled_mm` rowwise, or a Triton block-scaled GEMM); the path follows
from M alone, so CUDA graphs replay what they captured. On CPU the w8a16 reference at every M:
x @ dequantize(weight)^T in float32, rounded once to x's dtype (for float32 models the former
dequantize-then-F.linear result up to summation order). The skinny decode path of
models/llama.py reads tensor / channel-scaled layers as kernels Fp8Weight (`skinny_weight`: the
e4m3 tiles, the scale in the epilogue); start-up keeps it off for block-scaled models. Where a row count takes the w8a8 path on CUDA,
`input_quant_group` tells the model to have the RMSNorm / SiLU before the layer emit the FP8
activations itself (kernels/fp8_fused.py: no separate quantization launch); forward then takes
that `Fp8Activation` as well as a 16-bit x (o_proj after attention, w8a16 row counts).
"""

from __future__ import annotations

import torch
from torch import nn

import kernels
from executor_svc.model_loader.checks import ModelError
from executor_svc.quantization.schemes import Fp8Scheme
from kernels.fp8_reference import Fp8Activation, dequantize_fp8_reference, fused_quant_group
from kernels.fp8_weight import Fp8Weight

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# checkpoint tensor name -> our parameter (both names hold the multiplier)
SCALE_NAMES = {"weight_scale": "weight_scale", "weight_scale_inv": "weight_scale"}
INPUT_SCALE_NAMES = ("input_scale", "activation_scale")  # static activation scales: ignored
FP8_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class Fp8Linear(nn.Module):
    """y = x @ dequantize(weight, weight_scale).T + bias, with x and y in the compute dtype (or x
    an Fp8Activation). fuse_input_quantization: class-wide switch of input_quant_group (A/B runs)."""

    fuse_input_quantization: bool = True

    def __init__(self, in_features: int, out_features: int, strategy: str,
                 block: tuple[int, int] | None = None, bias: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.strategy, self.block = strategy, block
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(_scale_shape(strategy, block, out_features, in_features),
                                                     dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        return kernels.fp8_linear(x, self.weight, self.weight_scale, self.strategy, self.block, self.bias)

    def skinny_weight(self) -> Fp8Weight:
        """The weight as the skinny decode kernels read it (e4m3 and its per-tensor or per-channel
        scales; models/layers.skinny_weight). Block-scaled layers keep the skinny path off
        (skinny_fits)."""
        if not self.skinny_fits(self.strategy):
            raise ValueError(f"the skinny kernels take tensor / channel FP8 scales, not {self.strategy!r}")
        return Fp8Weight(self.weight, self.weight_scale)

    @staticmethod
    def skinny_fits(strategy: str) -> bool:
        return strategy in ("tensor", "channel")

    def input_quant_group(self, x: torch.Tensor) -> int | None:
        """For the 16-bit input x [..., K] this layer would get: the activation group size when its
        row count takes the w8a8 path on CUDA and the kernel before may quantize it (per token, or
        bk columns), else None. From the device, dtype and shape only (CUDA-graph safe)."""
        if not (self.fuse_input_quantization and x.is_cuda):
            return None
        rows = x.numel() // max(x.shape[-1], 1)
        return fused_quant_group(rows, x.dtype, self.strategy, self.block, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense weight [N, K]: fp8 -> fp32, times its scales, in `dtype`."""
        return dequantize(self.weight, self.weight_scale, self.strategy, self.block).to(dtype)

    def load(self, name: str, tensor: torch.Tensor, rows: tuple[int, int] | None,
             quantize: bool, where: str) -> list[str]:
        """Copies a checkpoint tensor ("weight" or "weight_scale") into `rows` of the output
        (None = all, else one part of a fused weight); with `quantize`, a dense weight is
        quantized per output channel first. Returns the parameters it filled."""
        start, stop = rows or (0, self.out_features)
        if quantize and (name != "weight" or tensor.dtype.itemsize == 1):
            raise ModelError(f"{where}: quantized tensors but config.json has no quantization_config "
                             f"(--quantization fp8 quantizes dense weights only)")
        if quantize:
            _check_shape(where, tensor, (stop - start, self.in_features))
            self.weight[start:stop], self.weight_scale[start:stop] = quantize_per_channel(tensor)
            return ["weight", "weight_scale"]
        if name == "weight":
            if tensor.dtype != FP8:
                raise ModelError(f"{where}: dtype {tensor.dtype} where the FP8 config needs float8_e4m3fn "
                                 f"(float8_e5m2 and unquantized projections are not supported)")
            _check_shape(where, tensor, (stop - start, self.in_features))
            self.weight[start:stop] = tensor
        else:
            self._load_scale(tensor, start, stop, where)
        return [name]

    def _load_scale(self, tensor: torch.Tensor, start: int, stop: int, where: str) -> None:
        """A checkpoint scale into rows start:stop: a part's scalar is repeated over its rows; a
        part's block rows start at start // bn (replace_linears checked that bn divides it)."""
        if self.strategy == "block":
            bn = self.block[0]
            _check_shape(where, tensor, (-(-(stop - start) // bn), self.weight_scale.shape[1]))
            self.weight_scale[start // bn:-(-stop // bn)] = tensor
        elif tensor.numel() == 1:  # per-tensor: the whole scale, or a fused part's rows
            self.weight_scale[start:stop if self.strategy == "channel" else None] = tensor.reshape(())
        else:
            if self.strategy != "channel" or tensor.numel() != stop - start or tensor.dim() > 2:
                raise ModelError(f"{where}: scale shape {tuple(tensor.shape)} does not fit a "
                                 f"per-{self.strategy} scale of {stop - start} rows")
            self.weight_scale[start:stop] = tensor.reshape(-1)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, strategy: str,
               block: tuple[int, int] | None) -> torch.Tensor:
    """fp8 weight [N, K] -> float32 [N, K] times its per-tensor / per-channel / per-block scales."""
    return dequantize_fp8_reference(weight, scale, strategy, block)


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense weight [N, K] -> (fp8 [N, K], float32 scales [N]): each row scaled so its
    largest magnitude lands on the e4m3 maximum (448), as vLLM quantizes at load."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def replace_linears(model: nn.Module, scheme: Fp8Scheme, dtype: torch.dtype, fused_parts: dict[str, list[int]]) -> None:
    """Swaps qkv_proj, o_proj, gate_up_proj and down_proj of every layer for Fp8Linear (meta
    device, before to_empty). fused_parts: fused name -> row bounds of its parts; block-wise
    scales concatenate only when the block divides every part (refused otherwise)."""
    strategy = scheme.strategy
    for fused, bounds in fused_parts.items():
        if strategy == "block" and any(b % scheme.block[0] for b in bounds):
            raise ModelError(f"quantization_config weight_block_size {list(scheme.block)} does not divide the "
                             f"parts of {fused} (row bounds {bounds}): their block scales cannot be fused")
    for layer in model.layers:
        for path in FP8_PROJECTIONS:
            owner_name, attr = path.split(".")
            owner, dense = getattr(layer, owner_name), getattr(getattr(layer, owner_name), attr)
            # a per-tensor scale per part of a fused weight becomes per-channel rows (exact)
            kind = "channel" if strategy == "tensor" and attr in fused_parts else strategy
            setattr(owner, attr, Fp8Linear(dense.in_features, dense.out_features, kind, scheme.block,
                                           bias=dense.bias is not None, dtype=dtype))


def is_fp8(model: nn.Module) -> bool:
    """Whether the model holds Fp8Linear layers (their weights are not dense matrices)."""
    return any(isinstance(m, Fp8Linear) for m in model.modules())


def _scale_shape(strategy: str, block: tuple[int, int] | None, n: int, k: int) -> tuple[int, ...]:
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (n,)
    return (-(-n // block[0]), -(-k // block[1]))


def _check_shape(where: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(expected):
        raise ModelError(f"{where}: shape {tuple(tensor.shape)} != {tuple(expected)}")
