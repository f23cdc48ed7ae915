"""GGUF files converted by gguf_model equal transformers' own GGUF loading, tensor by tensor; the
conversion is cached by the file's bytes; files we cannot serve are refused in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from executor_svc.model_loader import gguf as gguf_model
from executor_svc.model_loader.checks import ModelError
from executor_svc.model_loader.gguf import GGUFError, converted_folder, find_gguf
from executor_svc.model_loader.random_model import build_random_model
from executor_svc.model_loader.safetensors import load_model
from executor_svc.models.attention import AttentionMetadata
from executor_svc.startup.kv_cache import allocate_kv_caches
from scheduler_svc.core.tokenizer import Tokenizer
from tests.executor.gguf_files import write_gguf
from tests.executor.model_loader.test_model_checks import _one_error_line, _start

# transformers' GGUF config mapping ignores key_length: llama and qwen2 get head_dim = hidden /
# heads, qwen3 its config's default 128, so only these shapes load there. Qwen3 is tied, as the
# small Qwen3 models are; llama and qwen2 have their own lm_head.
SOURCES = {
    "llama": ("tiny-llama", {}),
    "qwen2": ("tiny-qwen2", {}),
    "qwen3": ("tiny-qwen3", {"head_dim": 128, "tie_word_embeddings": True}),
}
TEXTS = ["Hello, world!", "The quick brown fox", "Unicode: café, naïve, über, 日本語, emoji 🚀",
         "  leading spaces\nand lines\n\n", "<|bos|> special <|end|> and added <|x3|> tokens",
         "<|endoftext|> is no token of this vocabulary", ""]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi é 🚀"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "日本語?"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> (source HF folder, its .gguf file, our converted folder)."""
    base = tmp_path_factory.mktemp("gguf")
    (base / "files").mkdir()
    out = {}
    for i, (arch, (shape, overrides)) in enumerate(SOURCES.items()):
        source = build_random_model(base / arch, shape, seed=i, **overrides)
        gguf_file = write_gguf(source, base / "files" / f"{arch}.gguf", arch)
        out[arch] = (source, gguf_file, converted_folder(gguf_file, base / "cache", torch.float32))
    return out


@pytest.fixture
def source(tiny):
    return tiny["llama"][0]


def _transformers_gguf(gguf_file: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                dtype=torch.float32).eval()


def _assert_equal_tensor_by_tensor(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor],
                                   tied: bool) -> None:
    """ours (our safetensors) == theirs (transformers' state dict, which always holds lm_head)."""
    expected_names = set(theirs) - {"lm_head.weight"} if tied else set(theirs)
    assert set(ours) == expected_names
    unequal = [name for name in ours if not torch.equal(ours[name], theirs[name])]
    assert not unequal, f"{len(unequal)} tensors differ, e.g. {unequal[:3]}"
    if tied:
        assert torch.equal(theirs["lm_head.weight"], ours["model.embed_tokens.weight"])


@pytest.mark.parametrize("arch", SOURCES)
def test_conversion_equals_transformers_gguf_loading(arch, tiny):
    source, gguf_file, folder = tiny[arch]
    ours = load_file(str(folder / "model.safetensors"))
    hf = _transformers_gguf(gguf_file)
    tied = arch == "qwen3"
    _assert_equal_tensor_by_tensor(ours, hf.state_dict(), tied)
    config = json.loads((folder / "config.json").read_text())
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings", "max_position_embeddings"):
        assert config[key] == getattr(hf.config, key), key
    assert config["head_dim"] == (getattr(hf.config, "head_dim", None)  # Qwen2Config has none
                                  or hf.config.hidden_size // hf.config.num_attention_heads)
    assert config["rms_norm_eps"] == pytest.approx(hf.config.rms_norm_eps)
    # and close to the source weights: Q8_0 2-D weights, exact 1-D ones (llama's q/k rows are back
    # in Hugging Face order, which transformers could not tell us if it shared our mistake)
    for name, w in load_file(str(source / "model.safetensors")).items():
        torch.testing.assert_close(ours[name], w, atol=0 if w.dim() == 1 else 0.01, rtol=0, msg=name)


@pytest.mark.parametrize("arch", SOURCES)
def test_tokenizer_equals_the_source_folders(arch, tiny):
    from transformers import AutoTokenizer

    source, _, folder = tiny[arch]
    written = Tokenizer(source)  # the source's tokenizer.json as written
    expected, converted = AutoTokenizer.from_pretrained(str(source)), AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer(folder)  # the scheduler's tokenizer, on the converted folder
    assert converted.get_vocab() == written.hf.get_vocab(with_added_tokens=True)  # no id the model lacks
    assert ours.vocab_size == len(converted) == 512
    for text in TEXTS:
        ids = written.encode(text)
        assert converted(text)["input_ids"] == ours.encode(text) == ids, text
        if "<|endoftext|>" not in text:  # transformers' Qwen2Tokenizer adds it to the qwen2 source folder
            assert expected(text)["input_ids"] == ids, text
        assert ours.decode(ids) == converted.decode(ids, skip_special_tokens=True) == written.decode(ids)
    assert ours.render_chat(CHAT) == expected.apply_chat_template(CHAT, add_generation_prompt=True,
                                                                   tokenize=False)
    assert (ours.bos_token_id, ours.eos_token_ids) == (expected.bos_token_id, (expected.eos_token_id,))


def _step_meta(start: int, end: int, block_ids: list[int], block_size: int) -> AttentionMetadata:
    """One sequence computing its tokens [start, end) over the KV blocks block_ids."""
    table = torch.tensor([block_ids], dtype=torch.int32)
    pos = torch.arange(start, end)
    num_tokens = end - start
    return AttentionMetadata(
        slot_mapping=table[0, pos // block_size].long() * block_size + pos % block_size,
        block_tables=table, seq_lens=torch.tensor([end], dtype=torch.int32),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        max_query_len=num_tokens, max_seq_len=end, is_decode=num_tokens == 1)


def _our_greedy(model, prompt: list[int], num_tokens: int, block_size: int = 16) -> list[int]:
    """Prefill, then one decode step per token, over the paged KV cache."""
    caches = allocate_kv_caches(model.args, 8, block_size, torch.float32, torch.device("cpu"))
    ids, out, start = list(prompt), [], 0
    with torch.inference_mode():
        while len(out) < num_tokens:
            meta = _step_meta(start, len(ids), [3, 1, 5, 7], block_size)
            hidden = model(torch.tensor(ids[start:]), torch.arange(start, len(ids)), meta, caches)  # [T, H]
            out.append(int(model.compute_logits(hidden[-1:])[0].argmax()))
            start = len(ids)
            ids.append(out[-1])
    return out


@pytest.mark.parametrize("arch", SOURCES)
def test_our_model_on_the_converted_folder_decodes_like_transformers(arch, tiny):
    from transformers import AutoModelForCausalLM

    _, _, folder = tiny[arch]
    model = load_model(folder, "cpu", torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = Tokenizer(folder)
    for text in ("The quick brown fox", "Unicode: café, 日本語 🚀 and more text"):
        prompt = tok.encode(text)  # starts with BOS, id 0
        ids = torch.tensor([prompt])
        with torch.inference_mode():  # an explicit mask: generate() would take id 0 for padding
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                              min_new_tokens=12, do_sample=False, pad_token_id=0)
        assert _our_greedy(model, prompt, 12) == ref[0, len(prompt):].tolist(), text


# --- the cache ---------------------------------------------------------------------------------

def test_second_call_uses_the_cached_folder(source, tmp_path, monkeypatch, caplog):
    gguf_file = write_gguf(source, tmp_path / "m.gguf", "llama")
    folder = converted_folder(gguf_file, tmp_path / "cache", torch.float32)
    mtimes = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_model, "convert", no_conversion)
    with caplog.at_level(logging.INFO, logger="executor_svc.model_loader.gguf"):
        assert converted_folder(gguf_file, tmp_path / "cache", torch.float32) == folder
    assert f"GGUF m.gguf: using the converted model in {folder}" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == mtimes
    assert list((tmp_path / "cache" / "gguf").iterdir()) == [folder]  # no temporary folder left


def test_cache_key_follows_the_files_bytes_and_the_dtype(source, tmp_path):
    cache, gguf_file = tmp_path / "cache", tmp_path / "m.gguf"
    q8 = converted_folder(write_gguf(source, gguf_file, "llama", "Q8_0"), cache, torch.float32)
    q4 = converted_folder(write_gguf(source, gguf_file, "llama", "Q4_0"), cache, torch.float32)  # same name
    bf16 = converted_folder(gguf_file, cache, torch.bfloat16)
    assert len({q8, q4, bf16}) == 3 and all((f / "config.json").exists() for f in (q8, q4, bf16))
    name = "model.layers.0.mlp.up_proj.weight"
    w8, w4 = (load_file(str(f / "model.safetensors"))[name] for f in (q8, q4))
    assert not torch.equal(w8, w4)  # q4 is the new file's conversion, not the cached one
    assert load_file(str(bf16 / "model.safetensors"))[name].dtype == torch.bfloat16
    assert json.loads((bf16 / "config.json").read_text())["torch_dtype"] == "bfloat16"


# --- refusals ----------------------------------------------------------------------------------

def _refused(gguf_file: Path, cache: Path) -> str:
    """The one-line GGUFError converted_folder raises for gguf_file; nothing is left in the cache."""
    with pytest.raises(GGUFError) as e:
        converted_folder(gguf_file, cache, torch.float32)
    message = str(e.value)
    assert isinstance(e.value, ModelError) and "\n" not in message and message
    assert not (cache / "gguf").exists() or not list((cache / "gguf").iterdir())
    return message


def test_unsupported_architecture_is_refused_by_name(source, tmp_path):
    message = _refused(write_gguf(source, tmp_path / "phi.gguf", "llama", file_arch="phi3"), tmp_path / "c")
    assert message == "phi.gguf: GGUF architecture 'phi3' is not supported (supported: llama, qwen2, qwen3)"


def test_a_tensor_type_gguf_cannot_dequantize_is_refused_by_name(source, tmp_path):
    from gguf.quants import dequantize

    with pytest.raises(NotImplementedError):  # gguf has no dequantization for F64
        dequantize(np.zeros(4, np.float64), gguf.GGMLQuantizationType.F64)
    f64 = {"blk.0.attn_norm.weight": np.ones(64, np.float64)}
    message = _refused(write_gguf(source, tmp_path / "f64.gguf", "llama", extra_tensors=f64), tmp_path / "c")
    assert message == ("f64.gguf: tensor blk.0.attn_norm.weight uses quantization type F64, "
                       "which cannot be dequantized here")


@pytest.mark.parametrize("name,needle", [
    ("blk.0.ffn_gate_exps.weight", "GGUF tensor 'blk.0.ffn_gate_exps.weight' has no counterpart"),
    ("rope_freqs.weight", "per-dimension rope frequencies (rope_freqs.weight"),
])
def test_a_tensor_without_counterpart_is_refused_by_name(source, tmp_path, name, needle):
    gguf_file = write_gguf(source, tmp_path / "x.gguf", "llama", extra_tensors={name: np.ones((2, 8), np.float32)})
    assert needle in _refused(gguf_file, tmp_path / "c")


def test_files_that_are_not_gguf_are_refused(tmp_path, tiny):
    good = tiny["llama"][1].read_bytes()
    for name, data in [("empty.gguf", b""), ("text.gguf", b"not a model\n" * 100), ("cut.gguf", good[:2000])]:
        (tmp_path / name).write_bytes(data)
        assert _refused(tmp_path / name, tmp_path / "c").startswith(f"{name}: not a readable GGUF file (")


def test_a_folder_with_two_gguf_files_is_refused(source, tmp_path):
    assert find_gguf(tmp_path) is None  # no .gguf, no config.json: not ours to say
    write_gguf(source, tmp_path / "a.gguf", "llama")
    assert find_gguf(tmp_path) == tmp_path / "a.gguf" == find_gguf(tmp_path / "a.gguf")
    write_gguf(source, tmp_path / "b.gguf", "llama")
    with pytest.raises(GGUFError) as e:
        find_gguf(tmp_path)
    assert str(e.value) == f"{tmp_path} holds 2 .gguf files; name one: --model {tmp_path / 'a.gguf'}"


def test_executor_refuses_a_bad_gguf_in_one_line(source, tmp_path):
    phi = write_gguf(source, tmp_path / "phi.gguf", "llama", file_arch="phi3")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(phi.read_bytes())
    (tmp_path / "junk.gguf").write_bytes(b"\0" * 64)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    procs = [_start(["--model", str(path), *cache]) for path in (phi, two, tmp_path / "junk.gguf")]  # at once
    arch, folder, junk = (_one_error_line(p) for p in procs)
    assert arch.endswith("phi.gguf: GGUF architecture 'phi3' is not supported (supported: llama, qwen2, qwen3)")
    assert f"{two} holds 2 .gguf files" in folder
    assert "junk.gguf: not a readable GGUF file" in junk


# --- the built-in model ------------------------------------------------------------------------

def test_builtin_smollm2_conversion_equals_transformers_gguf_loading(smollm2_gguf, smollm2_folder):
    ours = load_file(str(smollm2_folder / "model.safetensors"))
    assert len(ours) == 272
    hf = _transformers_gguf(smollm2_gguf)
    _assert_equal_tensor_by_tensor(ours, hf.state_dict(), tied=True)
    assert json.loads((smollm2_folder / "config.json").read_text())["tie_word_embeddings"] is True
