"""Start-up refuses what the model code does not implement (one line naming the field and its
value) and loads what it does (sliding windows per layer, linear/dynamic/yarn/llama3 rope);
--max-model-len past the rotary table (or past max_position_embeddings for dynamic rope) is
refused; `--model` that is not a model folder is one line on stderr and a non-zero exit, never
a traceback or a Hub lookup."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from executor_svc.model_loader.checks import (ModelError, layer_windows, rope_max_positions, served_max_model_len,
                                       sliding_window)
from executor_svc.model_loader.safetensors import load_hf_config
from tests.executor.conftest import make_runner

ROOT = Path(__file__).resolve().parents[3]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "rope_theta": 1e4}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "factor": 2.0,
            "original_max_position_embeddings": 1024, "rope_theta": 1e4}
PER_LAYER_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                  "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 512, "rope_theta": 1e4}
REMOVE = object()  # a field taken out of config.json (None writes null)
QWEN_WINDOW = {"use_sliding_window": True, "sliding_window": 128, "max_window_layers": 1, "layer_types": REMOVE}


def variant(tmp_path: Path, model_dir: Path, weights: bool = False, **fields) -> Path:
    """A copy of model_dir (config.json alone unless weights) with fields set (or REMOVEd)."""
    folder = tmp_path / "variant"
    if weights:
        shutil.copytree(model_dir, folder)
    else:
        folder.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    for name, value in fields.items():
        if value is REMOVE:
            config.pop(name, None)
        else:
            config[name] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


REFUSED = [
    ("tiny-llama", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("tiny-llama", dict(attention_bias=True), "attention_bias=True"),
    ("tiny-qwen3", dict(attention_bias=True), "attention_bias=True"),
    ("tiny-llama", dict(mlp_bias=True), "mlp_bias=True"),
    ("tiny-llama", dict(rope_parameters=LONGROPE), "rope_type='longrope'"),
    ("tiny-qwen2", dict(rope_parameters=REMOVE, rope_scaling={"type": "su", "factor": 2.0}), "rope_type='su'"),
    ("tiny-qwen2", dict(rope_parameters=PER_LAYER_ROPE), "rope_parameters per layer type"),
    ("tiny-llama", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    ("tiny-llama", dict(quantization_config={"quant_method": "awq", "bits": 4}), "quantization_config='awq'"),
    ("tiny-llama", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    ("tiny-llama", dict(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
    ("tiny-llama", dict(num_key_value_heads=3), "not a multiple of num_key_value_heads=3"),
    ("tiny-qwen2", dict(layer_types=["full_attention", "linear_attention"]), "layer_types with ['linear_attention']"),
    ("tiny-llama", dict(model_type="gpt2"), "unsupported model_type 'gpt2'"),
    ("tiny-llama", dict(model_type="no-such-type"), "unsupported model_type 'no-such-type'"),
]


@pytest.mark.parametrize("arch, fields, named", REFUSED, ids=[r[2] for r in REFUSED])
def test_unimplemented_config_fields_are_refused_by_name(tmp_path, model_dirs, arch, fields, named):
    with pytest.raises(ModelError) as raised:
        load_hf_config(variant(tmp_path, model_dirs[arch], **fields))
    assert named in str(raised.value) and "\n" not in str(raised.value)


WINDOWS = [  # (arch, fields, the window transformers applies in each of the 2 layers)
    ("tiny-mistral", dict(sliding_window=128), (128, 128)),
    ("tiny-mistral", dict(sliding_window=4096), (4096, 4096)),  # longer than the context: harmless
    ("tiny-mistral", dict(sliding_window=None), (0, 0)),  # null (v0.2 and later)
    ("tiny-mistral", dict(sliding_window=REMOVE), (4096, 4096)),  # MistralConfig's default
    ("tiny-qwen2", QWEN_WINDOW, (0, 128)),  # layer 1 of 2 slides
    ("tiny-qwen2", {**QWEN_WINDOW, "max_window_layers": 0}, (128, 128)),
    ("tiny-qwen2", {**QWEN_WINDOW, "max_window_layers": 2}, (0, 0)),  # no layer slides
    ("tiny-qwen2", {**QWEN_WINDOW, "use_sliding_window": False}, (0, 0)),
    ("tiny-qwen3", dict(use_sliding_window=True, sliding_window=128,
                        layer_types=["sliding_attention", "full_attention"]), (128, 0)),
    ("tiny-qwen3", dict(sliding_window=128, layer_types=["sliding_attention", "full_attention"]), (0, 0)),
    ("tiny-llama", dict(sliding_window=128), (0, 0)),  # Llama's attention ignores the field
]


@pytest.mark.parametrize("arch, fields, windows", WINDOWS)
def test_sliding_windows_per_layer_serve_the_whole_context(tmp_path, model_dirs, arch, fields, windows):
    cfg = load_hf_config(variant(tmp_path, model_dirs[arch], **fields))
    assert layer_windows(cfg) == windows
    assert sliding_window(cfg) == (max(windows) or None)
    assert served_max_model_len(cfg, 0) == 2048  # no cap: the window is implemented
    assert served_max_model_len(cfg, 1024) == 1024
    with pytest.raises(ModelError, match="max_position_embeddings=2048"):
        served_max_model_len(cfg, 4096)


def test_rope_scalings_set_the_longest_context(tmp_path, model_dirs):
    """yarn covers original_max_position_embeddings * factor (Qwen2.5: 4 x 32768); dynamic NTK is
    exact only up to max_position_embeddings; linear and llama3 change no length."""
    yarn = load_hf_config(variant(tmp_path / "y", model_dirs["tiny-qwen2"], rope_parameters=YARN))
    assert rope_max_positions(yarn) == 8192
    assert served_max_model_len(yarn, 0) == 2048 and served_max_model_len(yarn, 8192) == 8192
    with pytest.raises(ModelError, match=r"--max-model-len 8193 > max_position_embeddings=2048 .*rope scaled to 8192"):
        served_max_model_len(yarn, 8193)
    dynamic = load_hf_config(variant(tmp_path / "d", model_dirs["tiny-llama"], rope_parameters=DYNAMIC))
    assert rope_max_positions(dynamic) == 2048 and served_max_model_len(dynamic, 2048) == 2048
    with pytest.raises(ModelError, match="rope_type='dynamic': --max-model-len 2049 > max_position_embeddings=2048"):
        served_max_model_len(dynamic, 2049)
    for rope in (LLAMA3, {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}):
        cfg = load_hf_config(variant(tmp_path / rope["rope_type"], model_dirs["tiny-llama"], rope_parameters=rope))
        assert rope_max_positions(cfg) == 2048


def test_rope_scalings_and_windows_load(tmp_path, model_dirs):
    llama3 = make_runner(variant(tmp_path / "a", model_dirs["tiny-llama"], weights=True, rope_parameters=LLAMA3))
    assert llama3.info().max_model_len == 512
    yarn = make_runner(variant(tmp_path / "b", model_dirs["tiny-qwen2"], weights=True, rope_parameters=YARN),
                       max_model_len=4096)
    assert yarn.info().max_model_len == 4096 and yarn.model.cos_sin_cache.shape[0] == 8192
    windowed = make_runner(variant(tmp_path / "c", model_dirs["tiny-mistral"], weights=True, sliding_window=64),
                           max_model_len=0)
    assert windowed.info().max_model_len == 2048
    assert [layer.self_attn.sliding_window for layer in windowed.model.layers] == [64, 64]


def _start(args: list[str], token: str | None = "t0ken") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if "INTERNAL_TOKEN" not in k}
    env.update({"OMP_NUM_THREADS": "1", **({"LLMSERVE_INTERNAL_TOKEN": token} if token else {})})
    return subprocess.Popen([sys.executable, "-m", "executor_svc", "--device", "cpu", "--port", "0", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _one_error_line(proc: subprocess.Popen) -> str:
    _, stderr = proc.communicate(timeout=120)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith("llmserve-executor: error: ")
    return lines[0]


def test_model_that_is_not_a_folder_with_config_json_is_one_line(tmp_path, model_dirs):
    empty = tmp_path / "empty"
    empty.mkdir()
    dynamic = variant(tmp_path, model_dirs["tiny-llama"], weights=True, rope_parameters=DYNAMIC)
    procs = [_start(["--model", "/nonexistent"]), _start(["--model", str(empty)]),  # at once: ~2 s
             _start(["--model", str(dynamic), "--max-model-len", "4096"]), _start(["--model", str(empty)], None)]
    missing, no_config, too_long, no_token = (_one_error_line(p) for p in procs)
    assert "--model /nonexistent: no such folder" in missing
    assert f"--model {empty}: the folder has no config.json" in no_config
    assert "rope_type='dynamic'" in too_long and "--max-model-len 4096" in too_long
    assert "no internal token" in no_token and "--insecure-no-auth" in no_token
