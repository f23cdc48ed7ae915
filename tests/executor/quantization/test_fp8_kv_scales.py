"""FP8 KV-cache scales from checkpoints (kv_cache_scheme + per-layer k/v scale tensors) on CPU:
the caches hold exactly the checkpoint's scales with --kv-cache-dtype fp8 (and none with auto,
as vLLM), the runner equals the model run over a cache quantized with those scales, the
scales change the cache contents and the outputs, calibrated scales beat 1.0 on a model with
small K/V values, and every refusal (schemes.py, kv_scales.py) is one line naming what."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.fp8_accuracy import compare, teacher_forced_logits
from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.startup.kv_cache import allocate_kv_caches
from tests.executor.conftest import make_runner
from tests.executor.fp8_files import add_kv_scales, shrink_kv, write_fp8_pair
from tests.executor.models.test_sliding_window import runner_greedy

FP8 = torch.float8_e4m3fn
PROMPT = list(range(5, 45))
NUM_TOKENS = 24
# distinct per layer and from 1.0; float32-exact
FIXED = [(0.015625, 0.0234375), (0.01171875, 0.03125)]


def _f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


@torch.inference_mode()
def forced_logits(model, tokens: list[int], prompt_len: int, cache_dtype, scales=None, block_size: int = 16):
    """Logits [len(tokens), V]: the prompt in one prefill, then one decode step per token, over a
    fresh cache of cache_dtype whose layers have `scales` (None: 1.0)."""
    n_blocks = -(-len(tokens) // block_size)
    caches = allocate_kv_caches(model.args, n_blocks + 1, block_size, cache_dtype, torch.device("cpu"), scales)
    table = torch.arange(1, 1 + n_blocks, dtype=torch.int32)[None]

    def step(lo: int, hi: int):
        pos = torch.arange(lo, hi)
        attn = AttentionMetadata(slot_mapping=block_size + pos, block_tables=table,
                                 seq_lens=torch.tensor([hi], dtype=torch.int32),
                                 query_start_loc=torch.tensor([0, hi - lo], dtype=torch.int32),
                                 max_query_len=hi - lo, max_seq_len=hi, is_decode=lo > 0)
        return model.compute_logits(model(torch.tensor(tokens[lo:hi]), pos, attn, caches))

    return torch.cat([step(0, prompt_len)] + [step(p, p + 1) for p in range(prompt_len, len(tokens))]).float()


def calibrate(model, tokens: list[int], prompt_len: int) -> list[tuple[float, float]]:
    """Per-layer (k, v) scales amax / 448 from the K/V an fp32 cache holds after a run of tokens."""
    runner_tokens = tokens[:prompt_len]
    caches = allocate_kv_caches(model.args, 8, 16, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        attn = AttentionMetadata(slot_mapping=16 + torch.arange(prompt_len), block_tables=torch.tensor(
            [[1, 2, 3, 4, 5, 6, 7]], dtype=torch.int32), seq_lens=torch.tensor([prompt_len], dtype=torch.int32),
            query_start_loc=torch.tensor([0, prompt_len], dtype=torch.int32), max_query_len=prompt_len,
            max_seq_len=prompt_len, is_decode=False)
        model(torch.tensor(runner_tokens), torch.arange(prompt_len), attn, caches)
    return [(_f32(c.k.abs().amax().item() / 448), _f32(c.v.abs().amax().item() / 448)) for c in caches]


@pytest.fixture(scope="module")
def small_kv(model_dirs, tmp_path_factory):
    """(FP8 folder with calibrated KV scales, its scales, its dense twin) of tiny-llama with K/V
    256 times smaller (all e4m3 subnormals at scale 1.0), FP8 compressed-tensors weights."""
    base = tmp_path_factory.mktemp("small_kv")
    src = shrink_kv(model_dirs["tiny-llama"], base / "small")
    fp8_dir, ref_dir = write_fp8_pair(src, base, "ct-tensor")
    scales = calibrate(load_model(ref_dir, "cpu", torch.float32), PROMPT, len(PROMPT))
    add_kv_scales(fp8_dir, scales)
    return fp8_dir, scales, ref_dir


@pytest.mark.parametrize("fmt,names,shape", [("ct-tensor", "attn", ()), ("ct-channel", "attn", (1,)),
                                             ("fp8-tensor-static", "output", ()), ("ct-tensor", "output", (1,))])
def test_fp8_caches_hold_exactly_the_checkpoint_scales(tmp_path, model_dirs, fmt, names, shape):
    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, fmt)
    add_kv_scales(fp8_dir, FIXED, names, shape)
    assert load_model(fp8_dir, "cpu", torch.float32).kv_scales == FIXED
    runner = make_runner(fp8_dir, kv_cache_dtype="fp8")
    assert len(runner.kv_caches) == len(FIXED)
    for cache, (k, v) in zip(runner.kv_caches, FIXED):
        assert cache.k.dtype == FP8 and cache.k_scale.dtype == cache.v_scale.dtype == torch.float32
        assert cache.k_scale.shape == cache.v_scale.shape == (1,)
        assert cache.k_scale.tolist() == [k] and cache.v_scale.tolist() == [v]
    assert len(runner_greedy(runner, PROMPT, 4)) == 4


def test_auto_keeps_the_model_dtype_and_ignores_the_scales_as_vllm(small_kv, caplog):
    fp8_dir, scales, _ = small_kv
    caplog.set_level(logging.INFO, logger="executor_svc.startup.kv_cache")
    runner = make_runner(fp8_dir)
    assert "not used, --kv-cache-dtype auto keeps the KV cache in torch.float32" in caplog.text
    for cache in runner.kv_caches:
        assert cache.k.dtype == torch.float32 and cache.k_scale.tolist() == [1.0] == cache.v_scale.tolist()
    caplog.clear()
    runner = make_runner(fp8_dir, kv_cache_dtype="fp8")
    assert "FP8 KV cache with the checkpoint's per-layer scales (2 layers" in caplog.text
    assert [(c.k_scale.item(), c.v_scale.item()) for c in runner.kv_caches] == scales


def test_the_runner_equals_the_model_over_a_cache_quantized_with_the_checkpoint_scales(small_kv):
    fp8_dir, scales, _ = small_kv
    assert all(s < 1e-3 for pair in scales for s in pair)  # far from 1.0: ignoring them shows
    runner = make_runner(fp8_dir, kv_cache_dtype="fp8")
    tokens = runner_greedy(runner, PROMPT, NUM_TOKENS)
    # layer 0's K/V of the prompt depend on the inputs only: the FP8 cache holds exactly the fp32
    # cache's values divided by the checkpoint's scale, rounded to e4m3 (not the values / 1.0)
    auto = make_runner(fp8_dir)
    runner_greedy(auto, PROMPT, 1)
    slots = slice(16, 16 + len(PROMPT))
    for got, want, scale in ((runner.kv_caches[0].k, auto.kv_caches[0].k, scales[0][0]),
                             (runner.kv_caches[0].v, auto.kv_caches[0].v, scales[0][1])):
        got, want = got.flatten(0, 1)[slots], want.flatten(0, 1)[slots]
        expected = (want / torch.tensor(scale)).clamp(-448, 448).to(FP8)
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
        assert not torch.equal(got.view(torch.uint8), want.clamp(-448, 448).to(FP8).view(torch.uint8))
    # the runner's greedy tokens are the model's over a cache with those scales, step by step
    model = load_model(fp8_dir, "cpu", torch.float32)
    scaled = forced_logits(model, PROMPT + tokens, len(PROMPT), FP8, scales)
    assert scaled[len(PROMPT) - 1:-1].argmax(-1).tolist() == tokens
    # ... and not the model's over a cache with scales 1.0 (nor an fp32 cache's, exactly)
    ones = forced_logits(model, PROMPT + tokens, len(PROMPT), FP8)
    assert ones[len(PROMPT) - 1:-1].argmax(-1).tolist() != tokens
    assert not torch.equal(scaled, forced_logits(model, PROMPT + tokens, len(PROMPT), torch.float32))
    # the helper agrees with the benchmark's teacher forcing where both apply (fp32 cache)
    torch.testing.assert_close(forced_logits(model, PROMPT + tokens, len(PROMPT), torch.float32),
                               teacher_forced_logits(model, torch.float32, PROMPT + tokens, len(PROMPT)))


def test_calibrated_scales_beat_one_on_small_kv_values(small_kv):
    """K/V all below e4m3's smallest normal (2^-6) at scale 1.0: amax / 448 scales restore the
    precision. Measured (seeded): cosine mean 0.944 -> 0.9985, min 0.82 -> 0.995, top-1 0.61 -> 0.89,
    KL 0.056 -> 0.0015."""
    fp8_dir, scales, _ = small_kv
    model = load_model(fp8_dir, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(1)
    tokens = PROMPT + torch.randint(3, model.args.vocab_size, (NUM_TOKENS,), generator=gen).tolist()
    want = forced_logits(model, tokens, len(PROMPT), torch.float32)
    one = compare(want, forced_logits(model, tokens, len(PROMPT), FP8))
    cal = compare(want, forced_logits(model, tokens, len(PROMPT), FP8, scales))
    print(f"\nscale 1.0: {one}\ncalibrated: {cal}")
    assert cal["cosine_mean"] > 0.995 and cal["cosine_min"] > 0.99 and cal["top1"] >= 0.8
    assert cal["cosine_mean"] > one["cosine_mean"] + 0.02 and cal["cosine_min"] > one["cosine_min"] + 0.05
    assert cal["top1"] >= one["top1"] + 0.15 and cal["kl_mean"] < one["kl_mean"] / 5


def _edit_tensors(folder, edit) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


LOADER_REFUSED = [
    ("missing", lambda t: t.pop("model.layers.1.self_attn.v_scale"),
     "model.layers.1.self_attn.v_scale missing from the checkpoint"),
    ("zero", lambda t: t.update({"model.layers.0.self_attn.k_scale": torch.tensor(0.0)}), "must be finite and > 0"),
    ("negative", lambda t: t.update({"model.layers.1.self_attn.v_scale": torch.tensor([-0.5])}), "-0.5"),
    ("inf", lambda t: t.update({"model.layers.0.self_attn.v_scale": torch.tensor(float("inf"))}), "inf"),
    ("nan", lambda t: t.update({"model.layers.0.self_attn.k_scale": torch.tensor(float("nan"))}), "nan"),
    ("per-head", lambda t: t.update({"model.layers.0.self_attn.k_scale": torch.full((2,), 0.01)}),
     "per-head or per-channel KV scales are not supported"),
    ("int", lambda t: t.update({"model.layers.0.self_attn.k_scale": torch.tensor(1)}), "dtype torch.int64"),
    ("fp8", lambda t: t.update({"model.layers.0.self_attn.k_scale": torch.tensor(0.5).to(FP8)}), "float8_e4m3fn"),
    ("twice", lambda t: t.update({"model.layers.0.self_attn.k_proj.output_scale": torch.tensor(0.01)}),
     "layer 0 already has a k scale"),
    ("no-such-layer", lambda t: t.update({"model.layers.7.self_attn.k_scale": torch.tensor(0.01)}),
     "the model has 2 layers"),
]


@pytest.mark.parametrize("edit,named", [r[1:] for r in LOADER_REFUSED], ids=[r[0] for r in LOADER_REFUSED])
def test_bad_kv_scale_tensors_are_refused_by_name(tmp_path, model_dirs, edit, named):
    from executor_svc.model_loader.checks import ModelError

    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, "ct-tensor")
    add_kv_scales(fp8_dir, FIXED)
    _edit_tensors(fp8_dir, edit)
    with pytest.raises(ModelError) as raised:
        load_model(fp8_dir, "cpu", torch.float32)
    assert named in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("fmt", ["ct-tensor", "fp8-tensor"])
def test_kv_scales_without_a_kv_cache_scheme_are_refused(tmp_path, model_dirs, fmt):
    import json

    from executor_svc.model_loader.checks import ModelError

    fp8_dir, _ = write_fp8_pair(model_dirs["tiny-llama"], tmp_path, fmt)
    add_kv_scales(fp8_dir, FIXED, "output" if fmt.startswith("fp8") else "attn")
    config = json.loads((fp8_dir / "config.json").read_text())
    config["quantization_config"].pop("kv_cache_scheme")
    (fp8_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="a KV-cache scale, but quantization_config has no kv_cache_scheme"):
        load_model(fp8_dir, "cpu", torch.float32)
    with pytest.raises(ModelError, match="no kv_cache_scheme"):  # nor on a dense checkpoint
        src = model_dirs["tiny-llama"]
        dense = tmp_path / "dense"
        dense.mkdir()
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                (dense / f.name).write_bytes(f.read_bytes())
        tensors = load_file(str(src / "model.safetensors"))
        save_file({**tensors, "model.layers.0.self_attn.k_scale": torch.tensor(0.01)}, str(dense / "model.safetensors"))
        load_model(dense, "cpu", torch.float32)


KV_INT8 = {"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False, "symmetric": True}
KV_STATIC = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
SCHEME_REFUSED = [
    ("int8", KV_INT8, "kv_cache_scheme type='int' num_bits=8"),
    ("4-bit", {**KV_STATIC, "num_bits": 4}, "num_bits=4"),
    ("channel", {**KV_STATIC, "strategy": "channel"}, "kv_cache_scheme strategy='channel'"),
    ("head", {**KV_STATIC, "strategy": "attn_head"}, "kv_cache_scheme strategy='attn_head'"),
    ("group", {**KV_STATIC, "strategy": "group", "group_size": 64}, "strategy='group'"),
    ("dynamic", {**KV_STATIC, "dynamic": True}, "kv_cache_scheme dynamic=True"),
    ("asymmetric", {**KV_STATIC, "symmetric": False}, "kv_cache_scheme symmetric=False"),
    ("string", "static", "kv_cache_scheme='static' is not supported"),
]


@pytest.mark.parametrize("scheme,named", [r[1:] for r in SCHEME_REFUSED], ids=[r[0] for r in SCHEME_REFUSED])
def test_other_kv_cache_schemes_are_refused_by_name(tmp_path, model_dirs, scheme, named):
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.model_loader.safetensors import load_hf_config
    from tests.executor.fp8_files import compressed_config
    from tests.executor.quantization.test_fp8 import _with_quantization

    config = {**compressed_config("channel", None), "kv_cache_scheme": scheme}
    with pytest.raises(ModelError) as raised:
        load_hf_config(_with_quantization(tmp_path, model_dirs["tiny-llama"], config))
    assert named in str(raised.value) and "\n" not in str(raised.value)
    (tmp_path / "ok").mkdir()
    load_hf_config(_with_quantization(tmp_path / "ok", model_dirs["tiny-llama"],
                                      {**config, "kv_cache_scheme": KV_STATIC}))  # the served one passes


@pytest.mark.parametrize("scheme", ["dynamic", {"num_bits": 8, "type": "float"}])
def test_an_fp8_config_takes_only_autofp8s_static_kv_scheme(tmp_path, model_dirs, scheme):
    from executor_svc.model_loader.checks import ModelError
    from executor_svc.model_loader.safetensors import load_hf_config
    from tests.executor.quantization.test_fp8 import _with_quantization

    config = {"quant_method": "fp8", "activation_scheme": "static", "kv_cache_scheme": scheme}
    with pytest.raises(ModelError, match=r"quant_method 'fp8'\): kv_cache_scheme=.* is not supported"):
        load_hf_config(_with_quantization(tmp_path, model_dirs["tiny-llama"], config))
