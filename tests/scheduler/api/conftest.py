"""A tiny tokenizer for the API tests (vocabulary 512, context 2048), built locally."""

import pytest

from scheduler_svc.core.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder, vocab_size=512, max_model_len=2048)
    return Tokenizer(folder)
