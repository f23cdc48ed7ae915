"""The FP8 model's fused activation quantization (kernels/fp8_fused.py) wired through
models/llama.py, on CPU: where Fp8Linear.input_quant_group asks for FP8 inputs (on CUDA: w8a8 row
counts), the input norm, the post-attention norm and SiLU-and-mul emit Fp8Activations for
qkv_proj, gate_up_proj and down_proj, o_proj still takes the attention output in the model's
dtype, and the logits equal those of the unfused w8a8 model bit for bit."""

from __future__ import annotations

import pytest
import torch

import kernels
from executor_svc.model_loader.safetensors import load_model
from executor_svc.quantization.fp8 import Fp8Linear
from kernels.fp8_reference import Fp8Activation, activation_group_size
from tests.executor.fp8_files import write_fp8_pair
from tests.executor.quantization.test_fp8 import logits_of, projections


@pytest.mark.parametrize("fmt,block", [("ct-channel", None), ("fp8-tensor", None), ("fp8-block", [32, 32])])
def test_fused_quantization_gives_the_unfused_w8a8_logits(tmp_path, model_dirs, monkeypatch, fmt, block):
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, fmt, block=block)
    model = load_model(fp8_dir, "cpu", torch.float32)
    inputs: list[str] = []
    real = kernels.fp8_linear

    def w8a8_everywhere(x, *args, **kwargs):  # CPU: the w8a8 reference for 16/32-bit inputs too
        inputs.append("fp8" if isinstance(x, Fp8Activation) else "dense")
        return real(x, *args, **kwargs) if isinstance(x, Fp8Activation) else real(x, *args, path="w8a8")

    monkeypatch.setattr(kernels, "fp8_linear", w8a8_everywhere)
    unfused = logits_of(model)
    assert set(inputs) == {"dense"}
    inputs.clear()
    monkeypatch.setattr(Fp8Linear, "input_quant_group",
                        lambda self, x: activation_group_size(self.strategy, self.block, self.in_features))
    fused = logits_of(model)
    assert inputs == ["fp8", "dense", "fp8", "fp8"] * len(model.layers)  # qkv, o, gate_up, down
    assert torch.equal(fused, unfused)


def test_cpu_and_small_row_counts_take_dense_inputs(tmp_path, model_dirs):
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-channel")
    model = load_model(fp8_dir, "cpu", torch.bfloat16)
    for proj in projections(model):  # CPU: the w8a16 reference at every row count, never fused
        assert proj.input_quant_group(torch.zeros(64, proj.in_features, dtype=torch.bfloat16)) is None
    Fp8Linear.fuse_input_quantization = False  # the class switch (A/B runs) is on by default
    try:
        assert projections(model)[0].input_quant_group(torch.zeros(64, 64)) is None
    finally:
        Fp8Linear.fuse_input_quantization = True
