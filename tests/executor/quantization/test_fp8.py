"""FP8 weights on CPU: checkpoints in each accepted format (fp8 per-tensor and block-wise,
compressed-tensors tensor and channel strategies) give the logits of their dequantized weights
loaded as float32, greedy tokens included; --quantization fp8 stays close to the float32 model;
every other quantization config is refused by name (never loaded as dense weights)."""

from __future__ import annotations

import json

import pytest
import torch

from executor_svc.config import ExecutorConfig
from executor_svc.model_loader.checks import ModelError
from executor_svc.model_loader.safetensors import load_hf_config, load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.quantization.fp8 import FP8_PROJECTIONS, Fp8Linear
from executor_svc.startup.kv_cache import allocate_kv_caches
from step_protocol.domain import NewRequestData, SamplerParams, StepPlan
from tests.executor.conftest import ARCHS, decode_rows, make_runner
from tests.executor.fp8_files import (
    FORMATS,
    compressed_config,
    quantize_tiles,
    write_fp8_pair,
)

NUM_TOKENS = 40
IDS = torch.randint(0, 512, (NUM_TOKENS,), generator=torch.Generator().manual_seed(3))


def logits_of(model) -> torch.Tensor:
    """Logits [T, V] of one prefill of IDS (one request in KV blocks 1, 2, 3 of 16 tokens)."""
    caches = allocate_kv_caches(model.args, 4, 16, torch.float32, torch.device("cpu"))
    attn = AttentionMetadata(slot_mapping=torch.arange(16, 16 + NUM_TOKENS), block_tables=torch.tensor([[1, 2, 3]],
                             dtype=torch.int32), seq_lens=torch.tensor([NUM_TOKENS], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, NUM_TOKENS], dtype=torch.int32),
                             max_query_len=NUM_TOKENS, max_seq_len=NUM_TOKENS, is_decode=False)
    with torch.inference_mode():
        return model.compute_logits(model(IDS, torch.arange(NUM_TOKENS), attn, caches))


def projections(model) -> list:
    """qkv_proj, o_proj, gate_up_proj and down_proj of every layer."""
    return [layer.get_submodule(path) for layer in model.layers for path in FP8_PROJECTIONS]


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])  # qwen2: a dense bias on the fp8 qkv_proj
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_fp8_checkpoint_gives_the_logits_of_its_dequantized_weights(tmp_path, model_dirs, arch, fmt):
    fp8_dir, ref_dir = write_fp8_pair(model_dirs[arch], tmp_path, fmt)
    model = load_model(fp8_dir, "cpu", torch.float32)
    for proj in projections(model):
        assert isinstance(proj, Fp8Linear) and proj.weight.dtype == torch.float8_e4m3fn
    assert model.lm_head.weight.dtype == torch.float32 and model.embed_tokens.weight.dtype == torch.float32
    torch.testing.assert_close(logits_of(model), logits_of(load_model(ref_dir, "cpu", torch.float32)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_quantization_fp8_at_load_is_close_to_the_float32_model(model_dirs, arch):
    model = load_model(model_dirs[arch], "cpu", torch.float32, quantization="fp8")
    for proj in projections(model):
        assert proj.weight.dtype == torch.float8_e4m3fn and proj.strategy == "channel"
        assert proj.weight_scale.shape == (proj.out_features,)
    assert model.lm_head.weight.dtype == torch.float32 and model.embed_tokens.weight.dtype == torch.float32
    dense = load_model(model_dirs[arch], "cpu", torch.float32)
    for proj, dense_proj in zip(projections(model), projections(dense)):  # per row: amax -> 448
        _, _, expected = quantize_tiles(dense_proj.weight, 1, dense_proj.in_features, torch.float32)
        assert torch.equal(proj.dequantized_weight(torch.float32), expected)
    got, ref = logits_of(model), logits_of(dense)
    cosine = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"\n{arch} --quantization fp8: logits cosine mean {cosine.mean():.5f} min {cosine.min():.5f}, "
          f"teacher-forced top-1 agreement {top1:.3f}")
    # random weights give near-tied logits (their top-2 gap is small): a few top-1 flips are expected
    assert cosine.mean() > 0.99 and cosine.min() > 0.98 and top1 >= 0.75


def greedy(runner, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy tokens of one request: the prompt in one step, then decode steps."""
    runner.reset()
    plan = StepPlan(1, [NewRequestData(1, prompt, SamplerParams(), [1, 2, 3, 4], 0, len(prompt))])
    tokens = [runner.execute(plan).sampled()[1]]
    for step_id in range(2, num_tokens + 1):
        tokens.append(runner.execute(StepPlan(step_id, [], decode_rows([1]))).sampled()[1])
    return tokens


@pytest.mark.parametrize("fmt", ["fp8-block", "ct-channel"])
def test_greedy_generation_on_an_fp8_checkpoint_matches_the_dequantized_model(tmp_path, model_dirs, fmt):
    fp8_dir, ref_dir = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, fmt)
    prompt = list(range(3, 30))
    runner = make_runner(fp8_dir)
    assert runner.model.skinny_max_tokens == 0
    assert greedy(runner, prompt, 16) == greedy(make_runner(ref_dir), prompt, 16)


def test_quantization_flag_parses_and_runs(model_dirs):
    assert ExecutorConfig.from_args(["--quantization", "fp8"]).quantization == "fp8"
    assert ExecutorConfig.from_args(["--quantization", "none"]).quantization == ""
    with pytest.raises(SystemExit):
        ExecutorConfig.from_args(["--quantization", "int8"])
    runner = make_runner(model_dirs["tiny-llama"], quantization="fp8")
    assert all(isinstance(p, Fp8Linear) for p in projections(runner.model))
    assert len(greedy(runner, [5, 6, 7], 4)) == 4


def _with_quantization(tmp_path, model_dir, quantization_config):
    """A copy of model_dir (config.json alone) whose config carries quantization_config."""
    folder = tmp_path / "variant"
    folder.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    return folder


INT8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False}
GROUP = {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "symmetric": True}
REFUSED = [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "quant_method 'gptq' is not supported"),
    ({"quant_method": "awq", "bits": 4, "zero_point": True}, "quant_method 'awq' is not supported"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes' is not supported"),
    (compressed_config("channel", None, INT8), "type='int' num_bits=8"),
    (compressed_config("group", None, GROUP), "strategy='group'"),
    ({**compressed_config("channel", None), "format": "pack-quantized"}, "format='pack-quantized'"),
    ({**compressed_config("channel", None), "ignore": ["lm_head", "re:.*down_proj"]}, "unquantized projections"),
    ({**compressed_config("channel", None), "kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": None, "input_activations": {"num_bits": 8, "type": "float"}}}},
     "activation-only"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fmt='e5m2'"),
    ({"quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}, "scale_fmt='ue8m0'"),
]


@pytest.mark.parametrize("config, named", REFUSED, ids=[r[1] for r in REFUSED])
def test_unsupported_quantization_configs_are_refused_by_name(tmp_path, model_dirs, config, named):
    with pytest.raises(ModelError) as raised:
        load_hf_config(_with_quantization(tmp_path, model_dirs["tiny-llama"], config))
    assert named in str(raised.value) and "\n" not in str(raised.value)


def test_a_block_that_does_not_divide_a_fused_part_is_refused(tmp_path, model_dirs):
    """k_proj and v_proj of tiny-llama have 32 rows: [64, 64] blocks cannot be concatenated."""
    folder = _with_quantization(tmp_path, model_dirs["tiny-llama"], {"quant_method": "fp8", "weight_block_size": [64, 64]})
    with pytest.raises(ModelError, match=r"weight_block_size \[64, 64\] does not divide the parts of qkv_proj"):
        load_model(folder, "cpu", torch.float32)


def test_e5m2_weights_are_refused(tmp_path, model_dirs):
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-channel", weight_dtype=torch.float8_e5m2)
    with pytest.raises(ModelError, match="dtype torch.float8_e5m2 where the FP8 config needs float8_e4m3fn"):
        load_model(fp8_dir, "cpu", torch.float32)


def test_fp8_weights_without_a_quantization_config_are_refused(tmp_path, model_dirs):
    """An FP8 file whose config.json lost its quantization_config is not cast to dense weights."""
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "fp8-tensor")
    _edit_config(fp8_dir, lambda c: c.pop("quantization_config"))
    with pytest.raises(ModelError, match="float8_e4m3fn weights where the config has no FP8|unexpected weight"):
        load_model(fp8_dir, "cpu", torch.float32)


def test_static_input_scales_need_a_static_scheme(tmp_path, model_dirs):
    """input_scale tensors are ignored only where the config declares static activations."""
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-tensor")
    _edit_config(fp8_dir, lambda c: c["quantization_config"]["config_groups"]["group_0"].update(input_activations=None))
    with pytest.raises(ModelError, match="unexpected weight .*input_scale"):
        load_model(fp8_dir, "cpu", torch.float32)


def test_quantization_at_load_refuses_already_quantized_tensors(tmp_path, model_dirs):
    """--quantization fp8 on FP8 tensors whose config lost its quantization_config: refused, not re-quantized."""
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-channel")
    _edit_config(fp8_dir, lambda c: c.pop("quantization_config"))
    with pytest.raises(ModelError, match="quantized tensors but config.json has no quantization_config"):
        load_model(fp8_dir, "cpu", torch.float32, quantization="fp8")


def _edit_config(folder, edit) -> None:
    """Rewrites folder/config.json after edit(config dict) changed it in place."""
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
