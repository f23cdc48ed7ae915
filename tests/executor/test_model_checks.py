"""Start-up refuses what the model code does not implement (one line naming the field and its
value) and loads harmless values; a sliding window shorter than the context caps it, or is
refused when --max-model-len asks for more; `--model` that is not a model folder is one line on
stderr and a non-zero exit, never a traceback or a Hub lookup."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from executor_svc.loader import load_hf_config
from executor_svc.model_checks import ModelError, served_max_model_len, sliding_window
from tests.executor.conftest import make_runner

ROOT = Path(__file__).resolve().parents[2]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 1e4}
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
        folder.mkdir()
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
    ("tiny-llama", dict(rope_parameters=YARN), "rope_type='yarn'"),
    ("tiny-llama", dict(rope_parameters=REMOVE, rope_scaling={"type": "linear", "factor": 2.0}), "rope_type='linear'"),
    ("tiny-qwen2", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), "rope_type='dynamic'"),
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


WINDOWS = [  # (arch, fields, window transformers applies, max_model_len served with no --max-model-len)
    ("tiny-mistral", dict(sliding_window=128), 128, 128),
    ("tiny-mistral", dict(sliding_window=4096), 4096, 2048),  # longer than the context: harmless
    ("tiny-mistral", dict(sliding_window=None), None, 2048),  # null (v0.2 and later)
    ("tiny-mistral", dict(sliding_window=REMOVE), 4096, 2048),  # MistralConfig's default
    ("tiny-qwen2", QWEN_WINDOW, 128, 128),  # layer 1 of 2 slides
    ("tiny-qwen2", {**QWEN_WINDOW, "max_window_layers": 2}, None, 2048),  # no layer slides
    ("tiny-qwen2", {**QWEN_WINDOW, "use_sliding_window": False}, None, 2048),
    ("tiny-qwen3", dict(use_sliding_window=True, sliding_window=128,
                        layer_types=["sliding_attention", "full_attention"]), 128, 128),
    ("tiny-qwen3", dict(sliding_window=128, layer_types=["sliding_attention", "full_attention"]), None, 2048),
    ("tiny-llama", dict(sliding_window=128), None, 2048),  # Llama's attention ignores the field
]


@pytest.mark.parametrize("arch, fields, window, served", WINDOWS)
def test_sliding_window_caps_the_context_or_is_harmless(tmp_path, model_dirs, caplog, arch, fields, window, served):
    cfg = load_hf_config(variant(tmp_path, model_dirs[arch], **fields))
    assert sliding_window(cfg) == window
    with caplog.at_level(logging.WARNING, logger="executor_svc.model_checks"):
        assert served_max_model_len(cfg, 0) == served
    assert ("sliding_window=128" in caplog.text) == (served == 128)
    assert served_max_model_len(cfg, 100) == 100
    if window is not None and window < 2048:
        with pytest.raises(ModelError, match="sliding_window=128: sliding-window attention is not implemented"):
            served_max_model_len(cfg, 256)  # asked for more than the window: refused
    with pytest.raises(ModelError, match="max_position_embeddings=2048"):
        served_max_model_len(cfg, 4096)


def test_harmless_values_load_and_a_short_window_serves_capped(tmp_path, model_dirs):
    llama3 = make_runner(variant(tmp_path / "a", model_dirs["tiny-llama"], weights=True, rope_parameters=LLAMA3))
    assert llama3.info().max_model_len == 512
    windowed = variant(tmp_path / "b", model_dirs["tiny-mistral"], weights=True, sliding_window=64)
    assert make_runner(windowed, max_model_len=0).info().max_model_len == 64
    with pytest.raises(ModelError, match="sliding_window=64"):
        make_runner(windowed, max_model_len=512)
    assert make_runner(model_dirs["tiny-mistral"], max_model_len=0).info().max_model_len == 2048  # window 4096


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
    windowed = variant(tmp_path, model_dirs["tiny-mistral"], weights=True, sliding_window=64)
    procs = [_start(["--model", "/nonexistent"]), _start(["--model", str(empty)]),  # at once: ~2 s
             _start(["--model", str(windowed), "--max-model-len", "256"]), _start(["--model", str(empty)], None)]
    missing, no_config, window, no_token = (_one_error_line(p) for p in procs)
    assert "--model /nonexistent: no such folder" in missing
    assert f"--model {empty}: the folder has no config.json" in no_config
    assert "sliding_window=64" in window and "--max-model-len 256" in window
    assert "no internal token" in no_token and "--insecure-no-auth" in no_token
